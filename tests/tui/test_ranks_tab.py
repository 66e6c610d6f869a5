"""The Ranks tab (DDP) and the Doctor tab: pure state and reports, then Pilot.

The Pilot test follows a 2-rank run through ``support.recorded_run.FakeEngine`` (the real
``transport.Server``): per-rank history from the store, live rows of rank 1, a stall,
findings from history and live, and a rank killed by SIGKILL as run.json records it.
"""

from __future__ import annotations

import asyncio
import random
import time
from io import StringIO

from rich.console import Console

from ptdash.shared import rundir
from ptdash.shared.protocol import Event, Metrics, Status
from ptdash.tui.app import make_app
from ptdash.tui.source.live import LiveSource
from ptdash.tui.source.replay import ReplaySource
from ptdash.tui.state import RunState
from ptdash.tui.tabs import doctor, ranks
from ptdash.tui.widgets.chart_panel import ChartPanel
from support.pilot import screen_text, until
from support.recorded_run import FINDINGS, RANK_LOSS, FakeEngine, make_ddp_run, make_run, rank_row, run_info

KILLED = dict(status="crashed", exit_code=-9, rank_failures=[{"rank": 1, "exitcode": -9}, {"rank": 0, "exitcode": -15}],
              detail="rank 1 killed by SIGKILL; the launcher then stopped rank 0")


def text_of(renderable, width: int = 100) -> str:
    console = Console(width=width, file=StringIO(), color_system=None, record=True)
    console.print(renderable)
    return console.export_text()


def rows(rank_steps: dict[int, float], steps=range(1, 21), **extra) -> RunState:
    """A state with ``steps`` of each rank, its step time as given."""
    state = RunState()
    for rank, step_s in rank_steps.items():
        state.add_metrics(Metrics(rank=rank, rows=[
            [s, 0.0, {"loss": RANK_LOSS * rank + 1.0, "time/step_s": step_s, "time/data_s": step_s / 4,
                      "throughput/samples_per_s": 64 / step_s, "grad/norm_total": 1.0, **extra}] for s in steps]))
    return state


# ---------------------------------------------------------------------------- pure


def test_state_keeps_ranks_apart():
    state = rows({0: 0.05, 1: 0.1})
    assert state.world_size == 2
    assert set(state.series["loss"].values) == {1.0}  # rank 0's own, nothing of rank 1
    assert state.rank_series[0] is state.series
    assert state.rank_series[1]["loss"].latest() == RANK_LOSS + 1.0
    assert "grad/norm_total" not in state.rank_series[1]  # only what the Ranks tab reads
    assert state.rank_step(1) == 20


def test_rank_rows_scores_stragglers_and_says_why_a_rank_stopped():
    state = rows({0: 0.05, 1: 0.05, 2: 0.09}, **{"host/rss_bytes": 2.0 ** 30})
    state.add_metrics(Metrics(rank=1, rows=[[20, 0.0, {"gpu1/mem_allocated_bytes": 3 * 2.0 ** 30}]]))
    by_rank = {r.rank: r for r in ranks.rank_rows(state)}
    assert by_rank[2].straggler == 0.09 / 0.05 and by_rank[0].straggler == 1.0
    assert by_rank[2].data_share == 0.25 and by_rank[2].samples_per_s == 64 / 0.09
    assert (by_rank[1].memory, by_rank[1].memory_kind) == (3 * 2.0 ** 30, "gpu")
    assert (by_rank[0].memory_kind, by_rank[0].status) == ("rss", "ok")

    # The slow rank's score is drawn white on red; the others plainly.
    console = Console(width=100, file=StringIO())
    lines = console.render_lines(ranks.table(state, 100), console.options.update(height=None), pad=False)
    scores = {seg.text.strip(): seg.style for line in lines for seg in line if seg.text.strip().endswith("×")}
    assert scores["1.80×"].bgcolor.name == "red"
    assert scores["1.00×"] is None or scores["1.00×"].bgcolor is None

    state.add_event(Event(kind="anomaly", step=20, wall=1.0, data={"stalled_rank": 2, "step": 20},
                          message="rank 2 stalled: no step for 130 s (at step 20)"))
    assert ranks.rank_rows(state)[2].status == "stalled"
    state.add_metrics(Metrics(rank=2, rows=[[21, 0.0, {"time/step_s": 0.09}]]))
    assert ranks.rank_rows(state)[2].status == "ok"  # it stepped again

    state.note_info(run_info(world_size=3, rank_failures=[{"rank": 2, "exitcode": -9}, {"rank": 0, "exitcode": 1}]))
    state.set_status(Status(state="crashed", step=21, exit_code=-9, detail="rank 2 killed by SIGKILL"))
    by_rank = {r.rank: r for r in ranks.rank_rows(state)}
    assert (by_rank[2].status, by_rank[2].detail) == ("failed", "killed by SIGKILL")
    assert (by_rank[0].status, by_rank[0].detail) == ("stopped", "exit code 1")
    assert by_rank[1].status == "crashed"
    text = text_of(ranks.table(state, 100))
    assert "failed killed by SIGKILL" in text and "rank 2 killed by SIGKILL" in text
    legend, chart = ranks.step_chart(state)
    assert len(chart.lines) == 3 and "r2 90.0 ms" in legend.plain


def test_single_process_says_so():
    state = rows({0: 0.05})
    assert state.world_size == 1
    assert "single-process run" in text_of(ranks.table(state))


def test_findings_once_per_rule_newest_first():
    state = RunState()
    assert doctor.EMPTY in text_of(doctor.report(state))
    for wall, step, rank, message, data in [
            (1.0, 5, 0, "grads-never-cleared: .grad keeps growing",
             {"id": "grads-never-cleared", "what": ".grad keeps growing\nof 4 parameters", "why": "backward adds",
              "fix": "zero_grad once per step", "source": "train.py:42", "severity": "error"}),
            (2.0, 5, 1, "grads-never-cleared: .grad keeps growing",
             {"id": "grads-never-cleared", "what": ".grad keeps growing", "why": "backward adds", "fix": "zero",
              "severity": "error"}),
            (3.0, 9, 0, "loss-plateau: no better loss for 500 steps",
             {"id": "loss-plateau", "what": "no better loss for 500 steps", "why": "stopped learning",
              "fix": "try another LR", "severity": "info"})]:
        line = state.add_event(Event(kind="finding", step=step, wall=wall, message=message, data=data, rank=rank))
        assert line.level == "finding" and "⚑ doctor: " in line.text
    assert len(state.findings) == 2 and state.findings.worst() == "error"  # the badge's colour
    newest, oldest = state.findings.newest_first()
    assert (newest.id, newest.severity) == ("loss-plateau", "info")
    assert (oldest.id, oldest.severity, oldest.ranks) == ("grads-never-cleared", "error", [0, 1])
    text = text_of(doctor.report(state))
    assert text.index("loss-plateau") < text.index("grads-never-cleared")
    assert "of 4 parameters" not in text  # what: its first line only
    assert "step 5, train.py:42, ranks 0, 1" in text and "why: backward adds" in text
    assert "fix: zero_grad once per step" in text and "2 findings  1 error  1 info" in text


# --------------------------------------------------------------------------- Pilot


def test_ranks_and_doctor_tabs_follow_a_ddp_run(tmp_path):
    run_dir = make_ddp_run(tmp_path, steps=200)

    async def scenario(engine: FakeEngine):
        app = make_app(LiveSource(run_dir), redraw_hz=20)
        async with app.run_test(size=(100, 32)) as pilot:
            await until(pilot, lambda: app.source.can_control, what="connection")
            await until(pilot, lambda: "6 Doctor (2)" in screen_text(app), what="count badge from history")

            # Ranks: both ranks from history, rank 1 (twice as slow) scored a straggler.
            await pilot.press("5")
            await until(pilot, lambda: "straggler" in screen_text(app), what="rank table")
            by_rank = {r.rank: r for r in ranks.rank_rows(app.state)}
            assert set(by_rank) == {0, 1} and by_rank[1].straggler > ranks.STRAGGLER
            assert f"{by_rank[1].straggler:.2f}×" in screen_text(app)

            # Live rows of rank 1 reach its row, never rank 0's charts.
            engine.step(3)
            rng = random.Random(5)
            live = [rank_row(s, 1, rng, time.time(), slow=2.0) for s in (201, 202, 203)]
            engine.server.publish(Metrics(rank=1, rows=live))
            await until(pilot, lambda: app.state.rank_step(1) == 203 and app.state.rank_step(0) == 203,
                        what="live rows of both ranks")
            loss = app.state.series["loss"]
            assert loss.last_step == 203 and max(v for v in loss.values if v is not None) < RANK_LOSS
            await until(pilot, lambda: "step time per rank" in screen_text(app), what="rank chart")
            assert len(app.query_one("#ranks-chart", ChartPanel).chart.lines) == 2

            engine.event("anomaly", "rank 1 stalled: no step for 130 s (at step 203)", stalled_rank=1, step=203)
            await until(pilot, lambda: "stalled at step 203" in screen_text(app), what="stalled rank")

            # Doctor: a live finding joins the stored ones, newest first, and the events pane.
            engine.event("finding", "lr-zero: the LR of group 1 is 0", id="lr-zero", what="the LR of group 1 is 0",
                         why="with a learning rate of 0 the update is zero", fix="check the scheduler's lambda")
            await until(pilot, lambda: "6 Doctor (3)" in screen_text(app), what="badge counts the live finding")
            await pilot.press("6")
            await until(pilot, lambda: "3 findings" in screen_text(app), what="doctor tab")
            text = screen_text(app)
            assert text.index("lr-zero") < text.index("input-bound") < text.index("grads-never-cleared")
            assert "fix: check the scheduler's lambda" in text and f"why: {FINDINGS[1][2]}" in text
            assert "ranks 0, 1" in text  # the stored finding both ranks raised
            assert [line.text for line in app.state.events if line.level == "finding"][-1].endswith(
                "⚑ doctor: lr-zero: the LR of group 1 is 0")

            # Rank 1 is killed: the launcher records it in run.json; the row says so.
            await pilot.press("5")
            rundir.update_info(run_dir, **KILLED)
            engine.server.stop()
            await until(pilot, lambda: "failed killed by SIGKILL" in screen_text(app), what="failed rank")
            text = screen_text(app)
            assert "stopped killed by SIGTERM" in text and "the launcher then stopped rank 0" in text
            assert "crashed (killed by SIGKILL)" in text.splitlines()[0]

    with FakeEngine(run_dir, step=200, world_size=2) as engine:
        asyncio.run(asyncio.wait_for(scenario(engine), 300))


def test_single_process_run_hides_ranks_and_has_no_findings(tmp_path):
    run_dir = make_run(tmp_path, steps=100, status="finished", exit_code=0)

    async def scenario():
        app = make_app(ReplaySource(run_dir), redraw_hz=20)
        async with app.run_test(size=(80, 24), notifications=True) as pilot:
            await until(pilot, lambda: app.state.connection_note == "replay (read-only)", what="history")
            await pilot.pause(0.2)
            tabs = screen_text(app).splitlines()[1]
            assert "5 Ranks" not in tabs and "6 Doctor" in tabs and "(" not in tabs
            await pilot.press("5")
            await until(pilot, lambda: "single-process run" in screen_text(app), what="why there is no Ranks tab")
            await pilot.press("6")
            await until(pilot, lambda: doctor.EMPTY in screen_text(app), what="empty doctor")

    asyncio.run(asyncio.wait_for(scenario(), 300))
