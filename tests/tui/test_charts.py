"""Pilot tests of the Overview's charts on a live run: the schedule ahead, the total, ETA and
epoch, and the chart keys (zoom, cursor, smoothing, log scale).

The engine is ``support.recorded_run.FakeEngine`` on a real socket; it publishes what the
real engine would (a Schedule, Status with a total and an epoch).
"""

from __future__ import annotations

import asyncio

from ptdash.shared.protocol import Schedule
from ptdash.tui.app import make_app
from ptdash.tui.fmt import fmt_num
from ptdash.tui.source.live import LiveSource
from ptdash.tui.tabs.overview import value_at
from support.pilot import screen_text, until
from support.recorded_run import schedule_ahead


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 300))


def lr_legend(app) -> str:
    return next(line for line in screen_text(app).splitlines() if "learning rate" in line)


def test_schedule_ahead_total_eta_epoch_and_chart_keys(live_run):
    run_dir, engine = live_run

    async def scenario():
        app = make_app(LiveSource(run_dir), redraw_hz=20)
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: app.source.can_control, what="connection")
            schedule = schedule_ahead(500, total=1120)
            engine.server.publish(schedule)
            engine.set_status(total_steps=1120)  # a CosineAnnealingLR(T_max=1120): no OneCycleLR total
            engine.step(3)
            await until(pilot, lambda: "schedule ahead to 1,120" in screen_text(app), what="the schedule ahead")
            assert "1k" in lr_legend(app) or "1k" in screen_text(app)  # the LR chart runs on to the end
            await until(pilot, lambda: "step 503/1,120" in screen_text(app) and "ETA" in screen_text(app),
                        what="the total and the ETA")
            engine.set_status(epoch=3)
            await until(pilot, lambda: "epoch 3" in screen_text(app).splitlines()[0], what="the epoch")

            # The cursor reads the schedule ahead; a new LR factor redraws it at once.
            await pilot.press("full_stop", *["greater_than_sign"] * 3)
            cursor = app.view.cursor
            assert cursor > 503
            planned = value_at(schedule.steps, schedule.lrs[0], cursor)
            await until(pilot, lambda: f"g0 {fmt_num(planned, 3)}" in lr_legend(app), what="the planned LR")
            engine.set_status(lr_scale=0.5)
            await until(pilot, lambda: f"g0 {fmt_num(planned * 0.5, 3)}" in lr_legend(app), what="the new factor")
            await pilot.press("escape")
            assert app.view.cursor is None

            # Zoom to the newest steps and back.
            before = app.view.window(1, 503)
            await pilot.press("plus")
            assert before is None and app.view.window(1, 503) == (252, 503)
            await until(pilot, lambda: "- Zoom" in screen_text(app).splitlines()[-1], what="zoom out key shown")
            await pilot.press("0")
            assert not app.view.zoomed

            # Smoothing and the y scale, said under the charts.
            await pilot.press("e")
            await until(pilot, lambda: "ema 0.99" in screen_text(app), what="stronger smoothing")
            await pilot.press("e")
            await until(pilot, lambda: "no smoothing" in screen_text(app), what="no smoothing")
            await pilot.press("y")
            await until(pilot, lambda: "─ log ─" in screen_text(app), what="log scale")
            await pilot.press("y")
            await until(pilot, lambda: "─ linear ─" in screen_text(app), what="linear scale")

            # The chart keys belong to the Overview: elsewhere they are not offered.
            await pilot.press("2")
            await until(pilot, lambda: "Smooth" not in screen_text(app).splitlines()[-1], what="keys hidden")
            await pilot.press("e")
            assert app.view.smoothing == 0.0

    run(scenario())


def test_a_schedule_set_by_hand_is_said_in_the_lr_panel(live_run):
    run_dir, engine = live_run

    async def scenario():
        app = make_app(LiveSource(run_dir), redraw_hz=20)
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: app.source.can_control, what="connection")
            engine.server.publish(Schedule(step=500, note="set by hand"))
            await until(pilot, lambda: "set by hand: history only" in screen_text(app), what="the note")

    run(scenario())
