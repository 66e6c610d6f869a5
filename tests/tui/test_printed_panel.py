"""Pilot test of the Overview's metrics panel on a live run: hidden until the script prints
a metric, then the validation loss drawn over the training loss, and ``v`` going through the
groups of printed metrics (and hidden with one group, where it does nothing).

The engine is ``support.recorded_run.FakeEngine`` on a real socket; its rows carry
``printed/<name>`` values as the real engine's flush writes them (engine/printed.py).
"""

from __future__ import annotations

import asyncio

from ptdash.shared import names
from ptdash.shared.protocol import Metrics
from ptdash.tui.app import make_app
from ptdash.tui.source.live import LiveSource
from ptdash.tui.widgets.chart_panel import ChartPanel
from support.pilot import screen_text, until


def printed_legend(app) -> str:
    return next((line for line in screen_text(app).splitlines() if "─ printed " in line), "")


def test_the_metrics_panel_shows_what_was_printed_and_v_goes_through_its_groups(live_run):
    run_dir, engine = live_run

    async def scenario():
        app = make_app(LiveSource(run_dir), redraw_hz=20)
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: app.source.can_control, what="connection")
            engine.step(2)
            await until(pilot, lambda: "step 502" in screen_text(app), what="the steps")
            panel = app.query_one("#metrics-panel", ChartPanel)
            assert not panel.display and printed_legend(app) == ""  # nothing printed yet: no panel
            assert not app.check_action("chart", ("metric",))
            step = engine.status.step
            engine.server.publish(Metrics(rows=[[step, 0.0, {names.printed("val_loss"): 2.2921}]]))
            await until(pilot, lambda: "val_loss 2.292" in printed_legend(app), what="the printed val loss")
            assert panel.display
            # The validation loss with the training loss ptdash records (the script printed none).
            assert "train loss" in printed_legend(app)
            assert not app.check_action("chart", ("metric",))  # one group: v does nothing
            engine.step(1)
            engine.server.publish(Metrics(rows=[[step + 1, 0.0, {names.printed("val_acc"): 0.91,
                                                                 names.printed("val_loss"): 2.25}]]))
            await until(pilot, lambda: "v: 1 of 2" in screen_text(app), what="a second group")
            assert "val_loss 2.25" in printed_legend(app) and "val_acc" not in printed_legend(app)
            assert app.check_action("chart", ("metric",))
            await pilot.press("v")
            await until(pilot, lambda: "val_acc 0.91" in printed_legend(app), what="the next group")
            assert "val_loss" not in printed_legend(app) and "v: 2 of 2" in screen_text(app)
            await pilot.press("v")
            await until(pilot, lambda: "val_loss 2.25" in printed_legend(app), what="back to the first")

    asyncio.run(asyncio.wait_for(scenario(), 300))
