"""The stacks screen (``k``), through Pilot, on runs the real engine wrote (record_engine_run.py):
one process whose training thread waited for a lock a thread of its own kept, and two gloo ranks
where rank 1 spun in Python. Every thread's stack, the training thread first, file:line of each
frame; it scrolls, Escape closes it, ``k`` opens it again. (A live run asked again:
tests/integration/test_stacks_screen.py.)"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from ptdash.tui.app import make_app
from ptdash.tui.source.replay import ReplaySource
from ptdash.tui.widgets.stacks_screen import StacksScreen
from support.pilot import screen_text, until

RUNS = Path(__file__).parent / "runs"


def _replay(tmp_path, name: str):
    run_dir = tmp_path / "run"
    shutil.copytree(RUNS / name, run_dir)  # replaying writes nothing, but SQLite may want side files beside it
    return make_app(ReplaySource(run_dir))


def _body(app) -> str:
    return str(app.screen.query_one("#stacks-body").render())


def test_one_process_stall_shows_every_thread_scrolls_and_closes(tmp_path):
    async def go() -> None:
        app = _replay(tmp_path, "one-hang")
        async with app.run_test(size=(100, 30)) as pilot:
            await until(pilot, lambda: app.drawn and app.state.stacks is not None, what="the stall's stacks")
            assert app.check_action("stacks", ()) is True  # a replay cannot be asked, but the stall kept some
            await pilot.press("k")
            await until(pilot, lambda: isinstance(app.screen, StacksScreen), what="the stacks screen")
            await pilot.pause(0.1)
            text, body = screen_text(app), _body(app)
            assert "Stacks at the stall at step 9" in text and "kept stacks (not a live run)" in text, text
            assert body.startswith("rank 0 was in `wait_for_prefetch` (train.py:")
            training, other = body.index("training thread MainThread"), body.index("thread prefetch")
            assert training < other < body.index("ptdash's own threads:")  # the training thread first
            assert "▶ wait_for_prefetch  train.py:" in body and "with lock:" in body
            assert "prefetch  train.py:" in body[other:] and "time.sleep(args.seconds)" in body[other:]
            assert "run  threading.py:" in body[other:]  # a library frame: file:line too
            scroll = app.screen.query_one("#stacks-scroll")
            assert scroll.max_scroll_y > 0 and scroll.scroll_y == 0
            await pilot.press("pagedown")
            await until(pilot, lambda: scroll.scroll_y > 0, what="scrolled")
            await pilot.press("escape")
            await until(pilot, lambda: not isinstance(app.screen, StacksScreen), what="closed")
            await pilot.press("k")
            await until(pilot, lambda: isinstance(app.screen, StacksScreen), what="open again")

    asyncio.run(go())


def test_two_ranks_side_by_side_then_each_rank_whole(tmp_path):
    async def go() -> None:
        app = _replay(tmp_path, "ddp-hang")
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: app.drawn and app.state.stacks is not None, what="the stall's stacks")
            await pilot.press("k")
            await until(pilot, lambda: isinstance(app.screen, StacksScreen), what="the stacks screen")
            body = _body(app)
            assert app.query_one("TabbedContent").active == "ranks"  # under it, the Ranks tab's side by side
            assert "ranks differ here:" in body and "▶ <module>  train.py:" in body
            whole = body.index("── every thread of each rank ──")
            zero, one = body.index("rank 0 (pid "), body.index("rank 1 (pid ")
            assert whole < zero < one and "▶ wait_for_lost_shard  train.py:" in body[one:]
            assert "▶ _engine_run_backward  torch/autograd/graph.py:" in body[zero:one]

    asyncio.run(go())


def test_a_run_without_stacks_offers_no_k(tmp_path):
    async def go() -> None:
        app = _replay(tmp_path, "ddp-stalled")  # a stall named before stacks were kept with it
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: app.drawn, what="drawn")
            assert app.state.stacks is None and not app.check_action("stacks", ())

    asyncio.run(go())
