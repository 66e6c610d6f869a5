"""Pilot tests of runs side by side: ``ptdash show A B`` and ``ptdash attach RUN --compare OTHER``.

The dashboard is built as the CLI builds it (``make_app`` with a ``Comparison``) over recorded
runs; the live case follows a FakeEngine on a real socket.
"""

from __future__ import annotations

import asyncio

from ptdash.tui.app import make_app
from ptdash.tui.compare import COLOURS, Comparison
from ptdash.tui.source.live import LiveSource
from ptdash.tui.source.replay import ReplaySource
from ptdash.tui.widgets.chart_panel import ChartPanel
from ptdash.tui.widgets.compare_table import CompareTable
from support.pilot import screen_text, until
from support.recorded_run import make_run


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 300))


def _lines(app, panel: str):
    return app.query_one(f"#{panel}-panel", ChartPanel).chart.lines


def test_show_a_b_overlays_both_runs_with_a_legend(tmp_path):
    a = make_run(tmp_path, steps=500, status="finished", exit_code=0, name="baseline")
    b = make_run(tmp_path, steps=300, status="finished", exit_code=0, name="wider", seed=5)

    async def scenario():
        app = make_app(ReplaySource(a), comparison=Comparison((b,)))
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: app.state.connection_note == "replay (read-only)" and app.drawn,
                        what="both runs drawn")
            for panel in ("loss", "lr", "grad"):
                lines = _lines(app, panel)
                # The reference first, the main run last (on top), each in its own colour.
                assert [line.style for line in lines] == [COLOURS[1], COLOURS[0]], panel
                assert [line.steps[-1] for line in lines] == [300, 500], panel
                legend = app.query_one(f"#{panel}-panel", ChartPanel).legend.plain
                assert "baseline" in legend and "wider" in legend, legend
            table = app.query_one(CompareTable).rows
            assert [(colour, cells[0], cells[2]) for colour, cells in table] == [
                (COLOURS[0], "baseline", "500"), (COLOURS[1], "wider", "300")]
            await until(pilot, lambda: "■ wider" in screen_text(app), what="the table on screen")
            text = screen_text(app)
            assert "━ baseline" in text and "━ wider" in text and "■ baseline" in text

            # t aligns the runs by time: the x axis becomes seconds since each run's first step.
            await pilot.press("t")
            await until(pilot, lambda: "x: s" in app.query_one("#loss-panel", ChartPanel).legend.plain,
                        what="the time axis")
            main, ref = _lines(app, "loss")[1], _lines(app, "loss")[0]
            assert main.steps[0] == 0.0 and 24 < main.steps[-1] < 26  # 500 steps of 0.05 s
            assert ref.steps[0] == 0.0 and 14 < ref.steps[-1] < 16
            await pilot.press("t")
            await until(pilot, lambda: "x: s" not in app.query_one("#loss-panel", ChartPanel).legend.plain,
                        what="back to steps")

    run(scenario())


def test_a_single_run_has_no_compare_key_or_table(recorded_run):
    async def scenario():
        app = make_app(ReplaySource(recorded_run))
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: app.state.connection_note == "replay (read-only)" and app.drawn,
                        what="the replay drawn")
            assert not app.query_one(CompareTable).display
            assert "By time" not in screen_text(app)
            assert app.check_action("toggle_time", ()) is False
            assert [line.style for line in _lines(app, "loss")] == ["grey50", "bright_cyan"]  # the usual chart

    run(scenario())


def test_attach_compare_draws_the_reference_behind_the_live_run(live_run, tmp_path):
    run_dir, engine = live_run
    reference = make_run(tmp_path / "ref", steps=800, status="finished", exit_code=0, name="last-week")

    async def scenario():
        app = make_app(LiveSource(run_dir), comparison=Comparison((reference,)))
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: app.source.can_control and app.drawn and len(_lines(app, "loss")) == 2,
                        what="the live run over its reference")
            ref, live = _lines(app, "loss")
            assert ref.steps[-1] == 800 and live.steps[-1] == 500
            engine.step(20)
            await until(pilot, lambda: _lines(app, "loss")[1].steps[-1] == 520, what="the live line to grow")
            assert _lines(app, "loss")[0].steps[-1] == 800  # the reference stays as it was read
            assert "Pause" in screen_text(app)  # the live run is still steered from here

    run(scenario())
