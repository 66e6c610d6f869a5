"""The System and Profiler tabs, the OOM panel and anomaly pauses: pure reports, then Pilot.

The Pilot test drives a live run through ``support.recorded_run.FakeEngine`` (the real
``transport.Server``): system metrics without and then with a partial GPU, a profile
request answered by a report, an anomaly that pauses the run, and an OOM.
"""

from __future__ import annotations

import asyncio
from io import StringIO

from rich.console import Console

from ptdash.shared.protocol import Ack, Event, Metrics
from ptdash.tui.app import make_app
from ptdash.tui.source.live import LiveSource
from ptdash.tui.state import RunState
from ptdash.tui.tabs import profiler, system
from ptdash.tui.widgets.header import RunHeader
from ptdash.tui.widgets.oom_screen import OomScreen
from support.pilot import screen_text, until
from support.recorded_run import FakeEngine, make_run

GIB = 2 ** 30

TOP = [
    {"name": "aten::addmm", "calls": 30, "self_ms": 12.5, "total_ms": 14.0, "self_device_ms": 0.0,
     "total_device_ms": 0.0, "cpu_mem_bytes": 3 * 2 ** 20, "device_mem_bytes": 0},
    {"name": "aten::gelu_backward", "calls": 10, "self_ms": 4.25, "total_ms": 4.25, "self_device_ms": 0.0,
     "total_device_ms": 0.0, "cpu_mem_bytes": 0, "device_mem_bytes": 0},
]

OOM = {"cuda": True, "device": "cuda:0", "error": "CUDA out of memory. Tried to allocate 2.00 GiB",
       "memory_summary": "|  Allocated memory  |  79.1 GiB  |", "allocator": [],
       "remedies": ["Reduce the batch size: activation memory grows with it.",
                    "Use mixed precision: run the forward pass under torch.autocast."]}


def text_of(renderable, width: int = 100) -> str:
    console = Console(width=width, file=StringIO(), color_system=None, record=True)
    console.print(renderable)
    return console.export_text()


def state_with(**values) -> RunState:
    state = RunState()
    state.add_metrics(Metrics(rows=[[10, 0.0, values]]))
    return state


# ---------------------------------------------------------------------------- pure


def test_system_without_gpu_metrics_says_no_cuda_device():
    state = state_with(**{"host/cpu_pct": 50.0, "host/proc_cpu_pct": 180.0, "host/rss_bytes": 1.5 * GIB,
                          "host/mem_used_bytes": 8 * GIB, "host/mem_total_bytes": 32 * GIB})
    text = text_of(system.report(state, 100))
    assert "no CUDA device" in text and "gpu0" not in text
    assert "50%" in text and "180% (1.8 cores)" in text and "1.5 GiB" in text and "8.0 GiB / 32.0 GiB" in text
    assert "no step timings yet" in text


def test_system_with_partial_gpu_metrics_shows_na():
    state = state_with(**{"gpu0/mem_allocated_bytes": 2 * GIB, "gpu0/mem_reserved_bytes": 3 * GIB,
                          "gpu0/alloc_retries": 2.0, "gpu0/temperature_c": None, "gpu0/ooms": 0.0})
    text = text_of(system.report(state, 120), 120)
    assert "gpu0" in text and "no CUDA device" not in text
    assert "allocated 2.0 GiB" in text and "reserved 3.0 GiB" in text and "peak N/A" in text
    assert "temp N/A" in text and "power N/A / N/A W" in text and "util" in text and "N/A" in text
    assert "retries 2" in text and "fragmentation" in text
    assert "CPU machine" in text and "N/A" in text  # host readings missing too


def test_step_split_medians_and_hint():
    state = RunState()
    rows = [[s, 0.0, {"time/data_s": 0.06, "time/compute_s": 0.03, "time/optim_s": 0.01, "time/step_s": 0.1}]
            for s in range(1, 60)]
    rows[-1][2]["time/data_s"] = 5.0  # one slow batch does not move a median
    state.add_metrics(Metrics(rows=rows))
    split = system.step_split(state)
    assert split["time/data_s"] == 0.06 and split["time/step_s"] == 0.1
    state.hint = "input-bound: 60% of each step is spent waiting for data; try more DataLoader workers"
    text = text_of(system.report(state, 100))
    parts = {line.split()[1]: line for line in text.splitlines() if line.strip().startswith("■")}
    assert "60.0 ms" in parts["data"] and "60%" in parts["data"]
    assert "30.0 ms" in parts["forward+backward"] and "10.0 ms" in parts["optimizer"]
    assert "step 100.0 ms" in text
    assert "hint: input-bound" in text


def test_profile_report_states():
    state = RunState()
    assert "press p" in text_of(profiler.report(state))
    state.profile_pending = "profiling steps 41-45…"
    assert "profiling steps 41-45…" in text_of(profiler.report(state))
    state.add_event(Event(kind="profile", step=45, wall=1.0, message="profiled steps 41-45",
                     data={"steps": [41, 45], "trace": "/runs/x/profiles/p.json", "device": "cpu", "top": TOP}))
    text = text_of(profiler.report(state))
    assert state.profile_pending is None
    assert "steps 41-45" in text and "aten::addmm" in text and "12.50" in text and "3.0 MiB" in text
    assert "/runs/x/profiles/p.json" in text and "Perfetto" in text
    state.add_event(Event(kind="profile", step=50, wall=2.0, message="failed",
                     data={"steps": [46, 50], "trace": None, "device": "cpu", "top": [],
                              "error": "another profiler is active"}))
    assert "profile failed: another profiler is active" in text_of(profiler.report(state))
    assert state.events[-1].level == "error"


def test_anomaly_pause_reason_lasts_while_paused():
    from ptdash.shared.protocol import Status

    state = RunState()
    state.set_status(Status(state="running", step=10))
    state.add_event(Event(kind="anomaly", step=11, wall=1.0, data={"action": "pause", "layer": "fc1.weight"},
                     message="non-finite gradient before the update of step 11, first in fc1.weight"))
    assert state.events[-1].level == "error"
    state.set_status(Status(state="paused", step=10, paused_at=10))
    assert state.pause_reason == "non-finite gradient in fc1.weight"
    state.set_status(Status(state="running", step=10))
    assert state.pause_reason is None


# --------------------------------------------------------------------------- Pilot


def test_system_profiler_oom_and_anomaly_tabs(tmp_path):
    run_dir = make_run(tmp_path, steps=100, status="running")

    async def scenario(engine: FakeEngine):
        app = make_app(LiveSource(run_dir), redraw_hz=20)
        async with app.run_test(size=(100, 32)) as pilot:
            await until(pilot, lambda: app.source.can_control, what="connection")

            # System: the recorded run has host readings only.
            await pilot.press("3")
            await until(pilot, lambda: "no CUDA device" in screen_text(app), what="no CUDA device")
            engine.server.publish(Metrics(rows=[[100, 0.0, {"gpu0/mem_allocated_bytes": 2.0 * GIB,
                                                            "gpu0/nvml_mem_total_bytes": 80.0 * GIB,
                                                            "gpu0/nvml_util_pct": None}]]))
            await until(pilot, lambda: "gpu0" in screen_text(app), what="gpu0")
            text = screen_text(app)
            assert "no CUDA device" not in text and "allocated 2.0 GiB" in text
            assert "temp N/A" in text and "reserved N/A" in text

            # Profiler: pending from the key press until the report arrives.
            await pilot.press("4")
            await until(pilot, lambda: "press p" in screen_text(app), what="empty profiler")
            await pilot.press("p")
            await until(pilot, lambda: "profiling steps 101-105…" in screen_text(app), what="pending profile")
            engine.event("profile", "profiled steps 101-105: top op aten::addmm", steps=[101, 105],
                         trace=str(run_dir / "profiles" / "profile-step101-105.json"), device="cpu", top=TOP)
            await until(pilot, lambda: "aten::gelu_backward" in screen_text(app), what="top ops")
            text = screen_text(app)
            assert "profiling steps" not in text and "steps 101-105" in text
            # The trace path is shown whole, wrapped at the screen's edge wherever its length puts the break.
            unwrapped = "".join(line.rstrip() for line in text.splitlines())
            assert str(run_dir / "profiles" / "profile-step101-105.json") in unwrapped

            # An anomaly pauses the run: the header says why, the events pane shows it.
            engine.event("anomaly", "non-finite gradient before the update of step 101, first in blocks.3.mlp.fc."
                         "weight; paused before the update", action="pause", layer="blocks.3.mlp.fc.weight")
            engine.set_status(state="paused", paused_at=100)
            header = app.query_one(RunHeader)
            await until(pilot, lambda: "non-finite gradient in blocks.3.mlp.fc.weight" in header.render().plain,
                        what="pause reason in the header")
            assert any(line.level == "error" and "anomaly" in line.text for line in app.state.events)
            await pilot.press("space")  # resume
            await until(pilot, lambda: app.state.status.state == "running", what="resumed")
            await until(pilot, lambda: "non-finite" not in header.render().plain, what="reason cleared")

            # OOM: a panel with the error, the remedies and the allocator summary.
            engine.event("oom", "out of memory: Reduce the batch size", **OOM)
            await until(pilot, lambda: isinstance(app.screen, OomScreen), what="OOM panel")
            await until(pilot, lambda: "Reduce the batch size" in screen_text(app), what="remedies")
            text = screen_text(app)
            assert "Tried to allocate 2.00 GiB" in text and "autocast" in text and "79.1 GiB" in text
            await pilot.press("escape")
            await until(pilot, lambda: not isinstance(app.screen, OomScreen), what="panel closed")
            await pilot.press("3")
            await until(pilot, lambda: "out of memory" in screen_text(app), what="OOM in the System tab")
            assert any(line.level == "error" and "oom" in line.text for line in app.state.events)

    with FakeEngine(run_dir, step=100) as engine:
        asyncio.run(asyncio.wait_for(scenario(engine), 300))


def test_refused_profile_is_said_plainly():
    state = RunState()
    state.profile_pending = "profiling the next 5 steps…"
    state.add_ack(Ack(id="1", name="profile", ok=False, step=3, message="a profile is already being recorded"),
                  "profile 5 steps")
    assert state.profile_pending is None
    assert "profile refused: a profile is already being recorded" in text_of(profiler.report(state))
