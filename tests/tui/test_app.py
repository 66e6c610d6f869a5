"""Pilot tests of the dashboard against a real control socket and a recorded run.

The engine side is ``support.recorded_run.FakeEngine``: the real ``transport.Server`` on a real
Unix socket with the run's token; nothing about the socket is mocked.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from ptdash.tui.app import make_app
from ptdash.tui.source.live import LiveSource
from ptdash.tui.source.replay import ReplaySource
from ptdash.tui.widgets.value_dialog import ValueDialog
from support.pilot import screen_text, until
from support.recorded_run import make_run


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 300))


def test_keys_send_the_right_commands(live_run):
    run_dir, engine = live_run

    async def scenario():
        app = make_app(LiveSource(run_dir))
        async with app.run_test(size=(100, 30)) as pilot:
            await until(pilot, lambda: app.source.can_control and app.state.status is not None, what="connection")
            await until(pilot, lambda: "running" in screen_text(app), what="running state")

            await pilot.press("space")
            await until(pilot, lambda: engine.names() == [("pause", None)], what="pause")
            await until(pilot, lambda: "paused at step 500" in screen_text(app), what="paused header")

            await pilot.press("space")
            await until(pilot, lambda: engine.names()[-1] == ("resume", None), what="resume")
            await until(pilot, lambda: "paused at" not in screen_text(app), what="running again")

            await pilot.press("c")
            await until(pilot, lambda: engine.names()[-1] == ("checkpoint", None), what="checkpoint")

            # A bad clip value is refused in the dialog and never sent.
            await pilot.press("g")
            await until(pilot, lambda: isinstance(app.screen, ValueDialog), what="clip dialog")
            await pilot.press("minus", "1", "enter")
            await until(pilot, lambda: "must be a finite number > 0" in screen_text(app), what="error text")
            assert isinstance(app.screen, ValueDialog)
            assert len(engine.names()) == 3
            await pilot.press("backspace", "backspace", "0", "full_stop", "5", "enter")
            await until(pilot, lambda: engine.names()[-1] == ("clip", 0.5), what="clip 0.5")
            await until(pilot, lambda: "clip 0.5 applied" in screen_text(app), what="clip ack")
            await until(pilot, lambda: "clip 0.5" in screen_text(app).splitlines()[0], what="clip in header")

            await pilot.press("l")
            await until(pilot, lambda: isinstance(app.screen, ValueDialog), what="LR dialog")
            await pilot.press(*["backspace"] * 5, "0", "full_stop", "2", "5", "enter")
            await until(pilot, lambda: engine.names()[-1] == ("lr_scale", 0.25), what="lr_scale")

            await pilot.press("p")
            await until(pilot, lambda: engine.names()[-1] == ("profile", 5), what="profile")

            # Stop asks first; "Stop cleanly" sends stop.
            await pilot.press("s")
            await until(pilot, lambda: "Stop cleanly" in screen_text(app), what="stop dialog")
            await pilot.click("#stop")
            await until(pilot, lambda: engine.names()[-1] == ("stop", None), what="stop")
            await until(pilot, lambda: "stopping" in screen_text(app), what="stopping state")

            engine.set_status(state="running")  # the script ignored it; leave it running
            await until(pilot, lambda: app.state.status.state == "running", what="running")
            await pilot.press("q")
            await until(pilot, lambda: "Leave running in background" in screen_text(app), what="quit dialog")
            await pilot.click("#detach")
        return app.return_value, engine.names()

    result, names = run(scenario())
    assert result == "detach"
    assert [n for n, _ in names] == ["pause", "resume", "checkpoint", "clip", "lr_scale", "profile", "stop"]


def _answer_dialog(run_dir, opener: str, shown: str, keys: tuple) -> object:
    """Open a dialog with the ``opener`` key, wait for ``shown`` on screen, press ``keys``;
    the app's return value."""
    async def scenario():
        app = make_app(LiveSource(run_dir))
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: app.source.can_control, what="connection")
            await pilot.press(opener)
            await until(pilot, lambda: shown in screen_text(app), what=shown)
            await pilot.press(*keys)
            await pilot.pause()
        return app.return_value

    return run(scenario())


def _sent(engine, command: tuple) -> bool:
    deadline = time.monotonic() + 3
    while command not in engine.names() and time.monotonic() < deadline:
        time.sleep(0.02)
    return command in engine.names()


@pytest.mark.parametrize("keys", [("s",), ("down", "enter")], ids=["key", "arrow"])
def test_quit_and_stop_returns_stop(live_run, keys):
    # The dialog's buttons are stacked: Down from "Leave running in background" is "Stop training".
    run_dir, engine = live_run
    assert _answer_dialog(run_dir, "q", "Stop training", keys) == "stop"
    assert _sent(engine, ("stop", None))


def test_the_arrow_keys_move_between_the_stop_dialogs_buttons(live_run):
    run_dir, engine = live_run
    # Stop cleanly, Kill now, Cancel, Kill now.
    _answer_dialog(run_dir, "s", "Kill now", ("down", "down", "up", "enter"))
    assert _sent(engine, ("kill", None))


def test_live_values_and_engine_disconnect(live_run):
    run_dir, engine = live_run

    async def scenario():
        app = make_app(LiveSource(run_dir), redraw_hz=20)
        async with app.run_test(size=(100, 30)) as pilot:
            await until(pilot, lambda: app.source.can_control, what="connection")
            engine.step(3)
            await until(pilot, lambda: "step 503/2,000" in screen_text(app), what="live step")
            loss = app.state.series["loss"]
            assert loss.last_step == 503
            # History and live rows meet without duplicates.
            assert loss.steps == sorted(set(loss.steps))
            latest = f"{loss.latest():.4g}"
            await until(pilot, lambda: latest in screen_text(app), what="latest loss on screen")
            engine.set_status(state="finished", exit_code=0)
            await until(pilot, lambda: "finished (exit code 0)" in screen_text(app), what="finished")
            engine.server.stop()
            await until(pilot, lambda: "engine disconnected" in screen_text(app), what="disconnect note")
            assert app.check_action("pause", ()) is False
            await pilot.press("q")  # ended: quits without asking
        return app.return_value

    assert run(scenario()) == "closed"


def test_replay_is_read_only(tmp_path):
    run_dir = make_run(tmp_path, steps=300, status="crashed", exit_code=1)

    async def scenario():
        app = make_app(ReplaySource(run_dir))
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: "crashed (exit code 1)" in screen_text(app), what="crashed state")
            text = screen_text(app)
            for key in ("Pause", "Checkpoint", "Clip", "Stop"):
                assert key not in text.splitlines()[-1]
            await pilot.press("space", "g")
            assert not isinstance(app.screen, ValueDialog)
            await pilot.press("question_mark")
            await until(pilot, lambda: "ptdash keys" in screen_text(app), what="help")
            assert "Checkpoint" in screen_text(app)
            await pilot.press("escape", "q")
        return app.return_value

    assert run(scenario()) == "closed"


@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
def test_screens_show_the_essentials(tmp_path, size):
    run_dir = make_run(tmp_path, steps=500, status="finished", exit_code=0)

    async def scenario():
        app = make_app(ReplaySource(run_dir))
        async with app.run_test(size=size) as pilot:
            await until(pilot, lambda: "finished (exit code 0)" in screen_text(app), what="history")
            await until(pilot, lambda: "epoch 0 step 500" in screen_text(app), what="log tail")
            svg = app.export_screenshot(title="ptdash")
            return screen_text(app), svg

    text, svg = run(scenario())
    lines = text.splitlines()
    assert len(lines) == size[1]
    for expected in ("loss", "learning rate", "grad norm", "step 500/2,000", "0.3303", "epoch 0 step 500"):
        assert expected in text, expected
    assert any("⣿" in line or "⠉" in line for line in lines), "no braille on screen"
    assert "<svg" in svg
    if size[0] >= 120:
        assert "speed" in text and "samples/s" in text
        assert "anomaly" in text


@pytest.mark.parametrize("keeps", [False, True])
def test_r_rolls_back_only_on_a_run_that_keeps_snapshots(live_run, keeps):
    from ptdash.shared import rundir
    from ptdash.shared.config import RunConfig
    from ptdash.tui.app import help_rows

    run_dir, engine = live_run
    if keeps:
        rundir.update_info(run_dir, config=RunConfig(on_anomaly="pause", rollback_every=50))

    async def scenario():
        app = make_app(LiveSource(run_dir))
        async with app.run_test(size=(100, 30)) as pilot:
            await until(pilot, lambda: app.source.can_control and app.state.status is not None, what="connection")
            await pilot.press("r")
            await pilot.press("c")  # a command after it: once it arrived, so would a rollback sent before
            await until(pilot, lambda: engine.names()[-1:] == [("checkpoint", None)], what="checkpoint")
            assert (("rollback", None) in engine.names()) is keeps, engine.names()
            row = next(r for r in help_rows(app.check_action, False) if r[0] == "r")
            assert row[2] is keeps  # the help screen dims it where it does nothing

    run(scenario())
