"""When the headless front kills a run whose stop went unanswered (tui/hardstop.py): only
a run that never answered, never one whose stop is under way however long it takes."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ptdash.shared import rundir
from ptdash.shared.exits import STOP_GRACE_S
from ptdash.tui.hardstop import KILL_WAIT_S, UNANSWERED_S, HardStop


@pytest.fixture
def sleeper():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield proc
    proc.kill()
    proc.wait()


@pytest.mark.parametrize("state, killed", [("running", True), ("starting", True), ("stopping", False),
                                           ("stopped", False)])
def test_an_unanswered_stop_is_due_after_the_grace_and_an_answered_one_never(tmp_path, sleeper, state, killed):
    run_dir = rundir.create(tmp_path, "r")
    rundir.update_info(run_dir, status=state)
    now = [100.0]
    stop = HardStop(run_dir, sleeper, clock=lambda: now[0])
    assert stop.due() is None  # nothing asked
    stop.asked("stop")
    now[0] += STOP_GRACE_S + UNANSWERED_S - 0.01
    assert stop.due() is None
    now[0] += 0.02
    why = stop.due()
    assert (why is not None) == killed
    if killed:
        assert "did not answer the stop" in why
    assert stop.due() is None  # said once


def test_a_kill_is_due_soon_whatever_the_state_and_never_for_an_ended_process(tmp_path, sleeper):
    run_dir = rundir.create(tmp_path, "r")
    rundir.update_info(run_dir, status="stopping")
    now = [0.0]
    stop = HardStop(run_dir, sleeper, clock=lambda: now[0])
    stop.asked("kill")
    now[0] = KILL_WAIT_S
    assert "within 3 s of the kill" in stop.due()
    sleeper.kill()
    sleeper.wait()
    stop.asked("kill")
    now[0] += KILL_WAIT_S
    assert stop.due() is None


def test_under_ddp_the_stalled_rank_is_why(tmp_path, sleeper):
    run_dir = rundir.create(tmp_path, "r")
    rundir.update_info(run_dir, status="running", stalled="rank 1 stalled: no step for 5 s (at step 9); the others wait")
    now = [0.0]
    stop = HardStop(run_dir, sleeper, clock=lambda: now[0])
    stop.asked("stop")
    now[0] = STOP_GRACE_S + UNANSWERED_S
    assert stop.due().endswith("(rank 1 stalled: no step for 5 s (at step 9))")
