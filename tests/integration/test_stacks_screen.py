"""``k`` on a live single-process run, through the real CLI and Pilot: the stacks screen shows the
stacks the stall kept, then the engine's answer (every thread, the training thread first, file:line
of each frame), asks again on ``k``, and closes with Escape.

tests/scripts/hangs.py ``--hang lock``: the training thread waits for a lock a thread of the
script's own (``prefetch``) keeps: a deadlock, as far as the run can tell."""

from __future__ import annotations

import asyncio
import shutil

import pytest

from ptdash.tui.app import make_app
from ptdash.tui.source.live import LiveSource
from ptdash.tui.widgets.stacks_screen import StacksScreen
from support.pilot import screen_text, until
from support.runner import SCRIPTS, Run

pytestmark = pytest.mark.slow


def _body(app) -> str:
    return str(app.screen.query_one("#stacks-body").render())


async def _k(run: Run) -> None:
    app = make_app(LiveSource(run.run_dir), redraw_hz=10)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.source.can_control, what="connected")
        await until(pilot, lambda: app.state.stacks is not None, timeout=120, what="the stall's stacks")
        assert app.state.stacks[0] == "at the stall at step 4" and app.check_action("stacks", ()) is True
        await pilot.press("k")
        await until(pilot, lambda: isinstance(app.screen, StacksScreen), what="the stacks screen")
        await until(pilot, lambda: "Stacks asked for at" in screen_text(app), timeout=60, what="the answer drawn")
        text, body = screen_text(app), _body(app)
        assert "k asks again · Esc closes" in text and "asking" not in text
        assert body.startswith("rank 0 was in `wait_for_prefetch` (train.py:"), body
        training, other = body.index("training thread MainThread"), body.index("thread prefetch")
        assert training < other < body.index("ptdash's own threads:")
        assert "▶ wait_for_prefetch  train.py:" in body[training:other] and "with lock:" in body[training:other]
        assert "prefetch  train.py:" in body[other:] and "sleep" in body[other:]
        first = app.state.stacks
        await pilot.press("k")  # asks again: the title says so until the answer replaces it
        await until(pilot, lambda: app.state.stacks is not first, timeout=60, what="a second answer")
        await until(pilot, lambda: app.screen.shown is app.state.stacks and "asking" not in screen_text(app),
                    what="the second answer drawn")
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, StacksScreen), what="closed")
        assert app.query_one("TabbedContent").active == "overview"  # one process: no Ranks tab under it


def test_k_on_a_stalled_single_process_shows_every_thread_and_asks_again(tmp_path):
    shutil.copy(SCRIPTS / "hangs.py", tmp_path / "train.py")
    run = Run(tmp_path, "train.py", "--hang", "lock", "--rank", "0", "--at", "5", options=("--stall-timeout", "2"))
    try:
        asyncio.run(_k(run))
    finally:
        run.close()
