"""The System and Profiler tabs, the OOM panel and anomaly pauses, through Pilot.

The test drives a live run through ``support.recorded_run.FakeEngine`` (the real
``transport.Server``): system metrics without and then with a partial GPU, a profile
request answered by a report, an anomaly that pauses the run, and an OOM.
"""

from __future__ import annotations

import asyncio
import time

from ptdash.shared import events
from ptdash.shared.protocol import Samples
from ptdash.tui.app import make_app
from ptdash.tui.source.live import LiveSource
from ptdash.tui.widgets.header import RunHeader
from ptdash.tui.widgets.oom_screen import OomScreen
from support.pilot import screen_text, until
from support.recorded_run import PROFILE_TOP, FakeEngine, make_run

GIB = 2 ** 30

OOM = {"cuda": True, "device": "cuda:0", "error": "CUDA out of memory. Tried to allocate 2.00 GiB",
       "memory_summary": "|  Allocated memory  |  79.1 GiB  |", "allocator": [],
       "remedies": ["Reduce the batch size: activation memory grows with it.",
                    "Use mixed precision: run the forward pass under torch.autocast."]}


def test_system_profiler_oom_and_anomaly_tabs(tmp_path):
    run_dir = make_run(tmp_path, steps=100, status="running")

    async def scenario(engine: FakeEngine):
        app = make_app(LiveSource(run_dir), redraw_hz=20)
        async with app.run_test(size=(100, 32)) as pilot:
            await until(pilot, lambda: app.source.can_control, what="connection")

            # System: the recorded run has host readings only.
            await pilot.press("3")
            await until(pilot, lambda: "no CUDA device" in screen_text(app), what="no CUDA device")
            engine.server.publish(Samples(rows=[[time.time(), {"gpu0/mem_allocated_bytes": 2.0 * GIB,
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
            report = {"steps": [101, 105], "trace": str(run_dir / "profiles" / "profile-step101-105.json"),
                      "device": "cpu", "top": PROFILE_TOP}
            engine.event(events.Profile.from_data(report), "profiled steps 101-105: top op aten::addmm")
            await until(pilot, lambda: "aten::gelu_backward" in screen_text(app), what="top ops")
            text = screen_text(app)
            assert "profiling steps" not in text and "steps 101-105" in text
            # The trace path is shown whole, wrapped at the screen's edge wherever its length puts the break.
            unwrapped = "".join(line.rstrip() for line in text.splitlines())
            assert str(run_dir / "profiles" / "profile-step101-105.json") in unwrapped

            # An anomaly pauses the run: the header says why, the events pane shows it.
            engine.event(events.Anomaly(step=101, action="pause", layer="blocks.3.mlp.fc.weight"),
                         "non-finite gradient before the update of step 101, first in blocks.3.mlp.fc.weight; "
                         "paused before the update")
            engine.set_status(state="paused", paused_at=100)
            header = app.query_one(RunHeader)
            await until(pilot, lambda: "non-finite gradient in blocks.3.mlp.fc.weight" in header.render().plain,
                        what="pause reason in the header")
            assert any(line.level == "error" and "anomaly" in line.text for line in app.state.events)
            await pilot.press("space")  # resume
            await until(pilot, lambda: app.state.status.state == "running", what="resumed")
            await until(pilot, lambda: "non-finite" not in header.render().plain, what="reason cleared")

            # OOM: a panel with the error, the remedies and the allocator summary.
            engine.event(events.Oom.from_data(OOM), "out of memory: Reduce the batch size")
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




def test_the_system_and_layers_tabs_say_what_was_kept_as_counts(tmp_path):
    run_dir = make_run(tmp_path, steps=100, status="running", layers=20)

    async def scenario(engine: FakeEngine):
        app = make_app(LiveSource(run_dir), redraw_hz=20)
        async with app.run_test(size=(140, 40)) as pilot:
            await until(pilot, lambda: app.source.can_control, what="connection")
            engine.server.publish(Samples(rows=[[time.time(), {
                "ptdash/step_pct": 1.4, "ptdash/threads_pct": 0.5, "ptdash/budget_pct": 1.0,
                "ptdash/layers_every": 32.0, "ptdash/doctor_every": 512.0, "ptdash/kept_steps": 100.0,
                "ptdash/kept_norm_steps": 71.0, "ptdash/kept_layer_steps": 9.0, "ptdash/kept_ratio_steps": 1.0}]]))
            await pilot.press("3")
            await until(pilot, lambda: "kept: total grad norm at 71 of 100 steps, per-layer norms at 9, update "
                        "ratios at 1 (this engine process)" in screen_text(app), what="kept counts")
            await pilot.press("2")
            await until(pilot, lambda: "norms kept at 9 of 100 steps" in screen_text(app), what="layers summary")

    with FakeEngine(run_dir, step=100) as engine:
        asyncio.run(asyncio.wait_for(scenario(engine), 300))
