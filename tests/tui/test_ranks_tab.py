"""The Ranks tab (DDP) and the Doctor tab, through Pilot.

The first test follows a 2-rank run through ``support.recorded_run.FakeEngine`` (the real
``transport.Server``): per-rank history from the store, live rows of rank 1, a stall,
findings from history and live, and a rank killed by SIGKILL as run.json records it.
"""

from __future__ import annotations

import asyncio
import random
import time

from ptdash.shared import events, rundir
from ptdash.shared.protocol import Metrics
from ptdash.tui.app import make_app
from ptdash.tui.source.live import LiveSource
from ptdash.tui.source.replay import ReplaySource
from ptdash.tui.tabs import doctor, ranks
from ptdash.tui.widgets.chart_panel import ChartPanel
from support.pilot import screen_text, until
from support.recorded_run import FINDINGS, RANK_LOSS, FakeEngine, make_ddp_run, make_run, rank_row

KILLED = dict(status="crashed", exit_code=-9, rank_failures=[{"rank": 1, "exitcode": -9}, {"rank": 0, "exitcode": -15}],
              detail="rank 1 killed by SIGKILL; the launcher then stopped rank 0")


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

            engine.event(events.Stall(step=203, ranks=(1,), seconds=130.0, why="the others wait for it at step 204"),
                         "rank 1 stalled: no step for 130 s (at step 203)")
            await until(pilot, lambda: "stalled at step 203" in screen_text(app), what="stalled rank")

            # Doctor: a live finding joins the stored ones, newest first, and the events pane.
            engine.event(events.Finding(id="lr-zero", what="the LR of group 1 is 0",
                                        why="with a learning rate of 0 the update is zero",
                                        fix="check the scheduler's lambda"), "lr-zero: the LR of group 1 is 0")
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
