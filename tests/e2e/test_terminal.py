"""The product in a real terminal: tmux runs `ptdash`, send-keys types, capture-pane reads."""

from __future__ import annotations

import os
import re
import shutil
import signal
import sys
import time

import pytest

from ptdash.shared import rundir
from ptdash.shared.reader import StoreReader
from support.runner import ENV, SCRIPTS, kill_all, processes_in, rank_pid
from support.tmux import Terminal, require_tmux

PTDASH = f"{sys.executable} -m ptdash.tui.cli"
TERM_ENV = {"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "TERM": "xterm-256color",
            "XDG_RUNTIME_DIR": ENV["XDG_RUNTIME_DIR"]}  # the tests' private sockets and registry


@pytest.fixture
def term(request):
    require_tmux()
    t = Terminal(request.node.name[:20])
    yield t
    t.close()


def last_step(run_dir) -> int:
    try:
        with StoreReader(run_dir / "metrics.db") as s:
            return s.last_step() or 0
    except Exception:
        return 0


def wait_until(predicate, timeout=60, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def enter_value(term, key: str, hint: str, value: str) -> None:
    """Open a value dialog with ``key`` (it is up once its ``hint`` shows: a text of the
    dialog alone, not the footer's), replace its value with ``value`` and apply it, each
    step once the screen shows the last one took (a busy machine draws late)."""
    term.keys("main", key)
    term.wait_for("main", hint, 30)
    # The dialog selects its current value once it is up: typing replaces it. Until the
    # typed value shows alone in the field, the keys may have come too early: select all
    # clear the field (ctrl+a, ctrl+k: its start, then delete to its end) and type again.
    field = re.compile(rf"▊\s*{re.escape(value)}\s*▎")
    deadline = time.monotonic() + 60
    term.type("main", value)
    while not field.search(term.screen("main")):
        assert time.monotonic() < deadline, term.screen("main")
        time.sleep(0.5)
        if not field.search(term.screen("main")):
            term.keys("main", "C-a", "C-k")
            term.type("main", value)
    term.keys("main", "Enter")


def kill_engine(run_dir) -> None:
    import os
    import signal
    pid = rundir.read_info(run_dir).pid
    if pid and rundir.pid_alive(pid):
        os.kill(pid, signal.SIGKILL)


def test_demo_pause_resume_controls_and_leave_running(term, tmp_path):
    run_dir = tmp_path / "run"
    term.start("main", f"{PTDASH} --run-dir {run_dir} demo --steps 100000 --n-layer 1 --n-embd 32 "
                       f"--block-size 32 --batch-size 8", tmp_path, env=TERM_ENV)
    try:
        term.wait_for("main", "running", 90)
        wait_until(lambda: last_step(run_dir) >= 3, 90, "the demo to step")
        screen = term.wait_for("main", "loss")
        assert "learning rate" in screen and "grad norm" in screen

        # space pauses at a step boundary; the step counter stops.
        term.keys("main", "Space")
        screen = term.wait_for("main", "paused at step", 30)
        held = int(re.search(r"paused at step (\d+)", screen).group(1))
        time.sleep(1.5)
        assert last_step(run_dir) == held
        term.keys("main", "Space")
        wait_until(lambda: last_step(run_dir) > held + 2, 30, "training to resume")

        # c saves a checkpoint now.
        term.keys("main", "c")
        term.wait_for("main", "saved", 30)
        assert list((run_dir / "checkpoints").glob("step-*.pt"))

        # g with a bad value shows the error and sends nothing; a good one is applied.
        enter_value(term, "g", "Largest total grad norm", "-1")
        term.wait_for("main", "finite number > 0", 30)
        term.keys("main", "Escape")  # cancel, and nothing was sent
        wait_until(lambda: "Largest total grad norm" not in term.screen("main"), 30, "the dialog to close")
        enter_value(term, "g", "Largest total grad norm", "0.5")
        term.wait_for("main", "clip norm 0.5 from step", 60)

        # l sets the LR factor.
        enter_value(term, "l", "Multiplies every param group", "0.5")
        term.wait_for("main", "LR factor 1 -> 0.5", 60)

        # q, then "leave running": the dashboard exits, training goes on.
        term.keys("main", "q")
        term.wait_for("main", "Leave running", 10)
        term.keys("main", "l")
        term.wait_for("main", "Training continues in the background", 20)
        before = last_step(run_dir)
        wait_until(lambda: last_step(run_dir) > before + 3, 60, "training to continue after detach")
        events = [e.message for e in StoreReader(run_dir / "metrics.db").events()]
        assert any("clip norm" in m and "0.5" in m for m in events)
        assert any("refused" in m for m in events) is False  # the bad value never reached the engine

        # s (stop) from a re-attached dashboard ends the run cleanly.
        term.start("again", f"{PTDASH} attach {run_dir}", tmp_path, env=TERM_ENV)
        term.wait_for("again", "running", 30)
        term.keys("again", "s")
        term.wait_for("again", "Stop cleanly", 10)
        term.keys("again", "s")
        wait_until(lambda: rundir.read_info(run_dir).status == "stopped", 60, "a clean stop")
        assert list((run_dir / "checkpoints").glob("step-*.pt"))
    finally:
        kill_engine(run_dir)


def test_killing_the_terminal_keeps_training_and_attach_catches_up(term, tmp_path):
    run_dir = tmp_path / "run"
    term.start("main", f"{PTDASH} --run-dir {run_dir} {SCRIPTS / 'steady.py'} --sleep 0.02", tmp_path,
               env=TERM_ENV)
    try:
        term.wait_for("main", "running", 60)
        wait_until(lambda: last_step(run_dir) >= 5, 60, "steps")
        term.kill_session("main")  # the terminal is gone, like a dropped SSH connection
        at_kill = last_step(run_dir)
        wait_until(lambda: last_step(run_dir) > at_kill + 20, 30, "training to continue without a terminal")
        assert rundir.read_info(run_dir).status == "running"

        term.start("back", f"{PTDASH} attach", tmp_path, env=TERM_ENV)
        screen = term.wait_for("back", "running", 30)
        assert "loss" in screen
        term.keys("back", "Space")
        screen = term.wait_for("back", "paused at step", 30)
        held = int(re.search(r"paused at step (\d+)", screen).group(1))
        assert held > at_kill  # the whole history is there and the step kept growing
        time.sleep(1.0)
        assert last_step(run_dir) == held
    finally:
        kill_engine(run_dir)


def test_a_stalled_rank_is_marked_in_the_ranks_tab_of_a_live_ddp_run(term, tmp_path):
    """Two gloo ranks under the dashboard; rank 1's process stopped (SIGSTOP): the engine's
    stall detector names it and the Ranks tab marks its row, until it steps again."""
    shutil.copy(SCRIPTS / "ddp_bugs.py", tmp_path / "train.py")
    run_dir = tmp_path / "run"
    term.start("main", f"{PTDASH} --run-dir run --nproc-per-node 2 --stall-timeout 2 train.py --sleep 0.05",
               cwd=tmp_path, width=120, height=36, env=TERM_ENV)
    try:
        wait_until(lambda: last_step(run_dir) >= 5, 180, "both ranks to step")
        term.keys("main", "5")
        term.wait_for("main", "step time per rank", 30)
        rank1 = rank_pid(tmp_path, 1)
        os.kill(rank1, signal.SIGSTOP)
        try:
            screen = term.wait_for("main", "stalled", 120)
            (row,) = [line for line in screen.splitlines() if re.search(r"stalled\s+at step \d+", line)]
            assert re.match(r"\W*1\b", row), screen  # rank 1's row; rank 0, which waits for it, is not marked
        finally:
            os.kill(rank1, signal.SIGCONT)
        wait_until(lambda: "stalled" not in term.screen("main"), 120, "the mark to clear as rank 1 steps again")
        term.keys("main", "q")
        term.wait_for("main", "Leave running", 10)
        term.keys("main", "s")  # stop it
        term.wait_for("main", "EXITED", 120)
    finally:
        kill_all(processes_in(tmp_path))
