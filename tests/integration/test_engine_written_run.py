"""The dashboard, ``show --once`` and ``doctor`` on a run the real engine wrote.

One two-rank DDP job (gloo, through ``ptdash --nproc-per-node 2``) with bugs planted for the
doctor; the test stops rank 1's process (SIGSTOP) mid-run, so the engine's stall detector
names it, then lets it go on. Every reader is checked against what the engine wrote, not
against a hand-made fixture: the Ranks tab marks the stalled rank while it is stalled (live)
and the Doctor tab lists the findings (replayed), and the two commands print the same.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal

import pytest

from ptdash.shared import events
from ptdash.tui.app import make_app
from ptdash.tui.source.live import LiveSource
from ptdash.tui.source.replay import ReplaySource
from support.pilot import screen_text, until
from support.runner import ENV, SCRIPTS, Run, kill_all, processes_in, ptdash, rank_pid, wait_for

pytestmark = pytest.mark.slow


def _events(run: Run) -> list:
    with run.store() as s:
        return s.events()


def _stalls(run: Run) -> list[events.Stall]:
    return [what for e in _events(run) if isinstance(what := events.read(e), events.Stall)]


async def _ranks_tab_marks_the_stalled_rank(run: Run, rank1: int) -> None:
    app = make_app(LiveSource(run.run_dir), redraw_hz=10)
    async with app.run_test(size=(110, 32)) as pilot:
        await until(pilot, lambda: app.source.can_control, what="the dashboard connected")
        await pilot.press("5")
        await until(pilot, lambda: "rank" in screen_text(app) and "step time" in screen_text(app),
                    what="the Ranks tab")
        os.kill(rank1, signal.SIGSTOP)
        try:
            await until(pilot, lambda: re.search(r"stalled\s+at step \d+", screen_text(app)), timeout=120,
                        what="rank 1 marked stalled")
            row = next(line for line in screen_text(app).splitlines() if "stalled" in line)
            assert re.match(r"\W*1\b", row), row  # rank 1's row, not rank 0's (which waits for it)
            (stall,) = wait_for(lambda: [s for s in _stalls(run) if not s.ended], 60, what="the stall stored")
            assert stall.ranks == (1,) and "stopped" in stall.why
            listed = ptdash("ls", "--json", "--state", "stalled", cwd=run.run_dir.parent, env=ENV)  # as ls shows it
            assert listed.returncode == 0, listed.stderr
            assert [r["run_dir"] for r in json.loads(listed.stdout)] == [str(run.run_dir)], listed.stdout
        finally:
            os.kill(rank1, signal.SIGCONT)
        await until(pilot, lambda: "stalled" not in screen_text(app), timeout=120, what="the mark cleared")
        wait_for(lambda: any(s.ended for s in _stalls(run)), 120, what="the stall's end journaled")


async def _doctor_tab_of_the_replay(run_dir) -> None:
    app = make_app(ReplaySource(run_dir))
    async with app.run_test(size=(110, 40)) as pilot:
        await until(pilot, lambda: app.state.connection_note == "replay (read-only)" and app.drawn,
                    what="the replay drawn")
        await pilot.press("6")
        await until(pilot, lambda: "train-in-eval-mode" in screen_text(app), what="the Doctor tab")
        text = screen_text(app)
        assert "Net is in eval mode" in text and "ranks 0, 1" in text and "train.py" in text
        lines = [line.text for line in app.state.events]
        assert any("rank 1 stalled" in t and "stopped" in t for t in lines), lines
        assert any("every rank makes steps again" in t for t in lines), lines


def test_a_stalled_rank_is_marked_live_and_the_run_reads_back_as_the_engine_wrote_it(tmp_path):
    """One job, in order (one test: the phases share its processes)."""
    shutil.copy(SCRIPTS / "ddp_bugs.py", tmp_path / "train.py")
    run = Run(tmp_path, "train.py", "--sleep", "0.05", options=("--nproc-per-node", "2", "--stall-timeout", "2"),
              env={**ENV, "PYTHONWARNINGS": "default"})  # the script's own warning is one of the bugs
    try:
        wait_for(lambda: run.last_step(0) >= 5 and run.last_step(1) >= 5, 180, what="both ranks stepping")
        asyncio.run(_ranks_tab_marks_the_stalled_rank(run, rank_pid(tmp_path, 1)))
        ack = run.send("stop")
        assert ack.ok, ack
        assert run.wait(180) == 0
    finally:
        run.close()
        kill_all(processes_in(tmp_path))

    asyncio.run(_doctor_tab_of_the_replay(run.run_dir))
    doctor = ptdash("doctor", str(run.run_dir), cwd=tmp_path, env=ENV)
    assert doctor.returncode == 1, doctor.stderr  # 1: there are findings
    assert "train-in-eval-mode" in doctor.stdout and "ranks 0, 1" in doctor.stdout
    assert "planted warning from the script" in doctor.stdout and "train.py:" in doctor.stdout
    shown = ptdash("show", str(run.run_dir), "--once", cwd=tmp_path, env=ENV)
    assert shown.returncode == 0, shown.stderr
    assert "stopped" in shown.stdout and "train-in-eval-mode" in shown.stdout
