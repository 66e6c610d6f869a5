"""The clip and LR dialogs against a real control socket (FakeEngine): values out of the
engine's ranges never leave the dialog, a change of more than 10x takes a second Enter,
an empty box cancels, and the events pane shows a value as it was typed."""

from __future__ import annotations

import asyncio

from ptdash.tui.app import make_app
from ptdash.tui.source.live import LiveSource
from ptdash.tui.widgets.value_dialog import ValueDialog
from support.pilot import screen_text, until


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 300))


async def open_dialog(pilot, key: str) -> None:
    await pilot.press(key)
    await until(pilot, lambda: isinstance(pilot.app.screen, ValueDialog), what=f"the {key} dialog")


def said(app) -> str:
    """What the dialog says under its box (an error or a question), unwrapped."""
    return str(app.screen.query_one("#error").content) if isinstance(app.screen, ValueDialog) else ""


async def type_in(pilot, text: str) -> None:
    """Replace what the box holds with ``text``, key by key."""
    held = pilot.app.screen.query_one("#value").value
    await pilot.press("end", *["backspace"] * len(held), *text)


def test_the_lr_dialog_refuses_out_of_range_and_asks_before_a_big_change(live_run):
    run_dir, engine = live_run

    async def scenario():
        app = make_app(LiveSource(run_dir))
        async with app.run_test(size=(100, 30)) as pilot:
            await until(pilot, lambda: app.source.can_control and app.state.status is not None, what="connection")
            await open_dialog(pilot, "l")
            await type_in(pilot, "1e30")
            await pilot.press("enter")
            await until(pilot, lambda: said(app) == "LR factor must be from 1e-6 to 1000, got '1e30'",
                        what="the range error")
            await type_in(pilot, "20")
            await pilot.press("enter")
            await until(pilot, lambda: said(app).startswith("20 is 20x above the current 1:"), what="the question")
            assert isinstance(app.screen, ValueDialog) and engine.names() == []
            await pilot.press("enter")  # the same value again: applied
            await until(pilot, lambda: engine.names() == [("lr_scale", 20.0)], what="lr_scale 20")
            await until(pilot, lambda: "LR ×20 applied" in screen_text(app), what="the ack")

            # Back down by more than 10x, typed with an exponent: asked, then shown as typed.
            await open_dialog(pilot, "l")
            await type_in(pilot, "2.5e-4")
            await pilot.press("enter")
            await until(pilot, lambda: said(app).startswith("2.5e-4 is 8e+04x below the current 20:"), what="the question")
            await pilot.click("#apply")
            await until(pilot, lambda: engine.names()[-1] == ("lr_scale", 2.5e-4), what="lr_scale 2.5e-4")
            await until(pilot, lambda: "LR ×2.5e-4 applied" in screen_text(app), what="as typed")

            # A smaller change goes at once; a new text after a question is asked about afresh.
            await open_dialog(pilot, "l")
            await type_in(pilot, "1e-3")
            await pilot.press("enter")
            await until(pilot, lambda: engine.names()[-1] == ("lr_scale", 1e-3), what="lr_scale 1e-3")
            await pilot.press("q")
            await until(pilot, lambda: "Leave running" in screen_text(app), what="quit dialog")
            await pilot.click("#detach")
        return engine.names()

    assert run(scenario()) == [("lr_scale", 20.0), ("lr_scale", 2.5e-4), ("lr_scale", 1e-3)]


def test_the_clip_dialog_cancels_when_empty_and_turns_off_only_on_off(live_run):
    run_dir, engine = live_run

    async def scenario():
        app = make_app(LiveSource(run_dir))
        async with app.run_test(size=(100, 30)) as pilot:
            await until(pilot, lambda: app.source.can_control and app.state.status is not None, what="connection")
            await open_dialog(pilot, "g")
            await pilot.press("enter")  # empty: cancel, nothing sent
            await until(pilot, lambda: not isinstance(app.screen, ValueDialog), what="the dialog to close")
            for text, error in (("1e309", "clip norm must be a finite number > 0"), ("abc", "a number or off"),
                                ("1e7", "clip norm must be from 1e-6 to 1e6")):
                await open_dialog(pilot, "g")
                await type_in(pilot, text)
                await pilot.press("enter")
                await until(pilot, lambda: error in said(app), what=error)
                await pilot.press("escape")
            # The script clips at 1.0 (its grad/clip_max): 50 is more than 10x that.
            await open_dialog(pilot, "g")
            await type_in(pilot, "50")
            await pilot.press("enter")
            await until(pilot, lambda: said(app).startswith("50 is 50x above the current 1:"), what="the question")
            await pilot.press("enter")
            await until(pilot, lambda: engine.names() == [("clip", 50.0)], what="clip 50")
            # The box starts at the value in force; emptying it cancels instead of turning it off.
            await open_dialog(pilot, "g")
            assert app.screen.query_one("#value").value == "50"
            await type_in(pilot, "")
            await pilot.press("enter")
            await until(pilot, lambda: not isinstance(app.screen, ValueDialog), what="the dialog to close")
            await open_dialog(pilot, "g")
            await type_in(pilot, "off")
            await pilot.press("enter")
            await until(pilot, lambda: engine.names()[-1] == ("clip", None), what="clip off")
            await until(pilot, lambda: "clip off applied" in screen_text(app), what="the ack")
            await pilot.press("q")
            await until(pilot, lambda: "Leave running" in screen_text(app), what="quit dialog")
            await pilot.click("#detach")
        return engine.names()

    assert run(scenario()) == [("clip", 50.0), ("clip", None)]


def test_the_lr_key_is_dimmed_when_the_script_has_no_optimizer(live_run):
    # The engine says so in its status once the script's first step ended with no torch.optim
    # optimizer: the LR factor would be refused, so the key does nothing and the help dims it.
    run_dir, engine = live_run

    async def scenario():
        app = make_app(LiveSource(run_dir))
        async with app.run_test(size=(100, 30)) as pilot:
            await until(pilot, lambda: app.source.can_control and app.state.status is not None, what="connection")
            assert app.check_action("lr_factor", ()) is True
            engine.set_status(lr_fixed=True)
            await until(pilot, lambda: app.state.status.lr_fixed, what="the status")
            assert app.check_action("lr_factor", ()) is None and app.check_action("clip", ()) is True
            await pilot.press("l")
            await pilot.pause()
            assert not isinstance(app.screen, ValueDialog) and engine.names() == []
            await open_dialog(pilot, "g")  # the clip still works on such a script

    run(scenario())
