"""The terminal told, and every series charted: the raw output of a dashboard run in a pty
carries the desktop notification when the run ends; in tmux, the Metrics tab of a run that
prints six metrics lists them all, and ``/ valid`` narrows it to the ``valid_*`` ones."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import struct
import sys
import termios
import time

import pytest

from ptdash.shared import rundir
from support.runner import ENV, SCRIPTS
from support.tmux import Terminal, require_tmux

PTDASH = f"{sys.executable} -m ptdash.tui.cli"
TERM_ENV = {"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "TERM": "xterm-256color",
            "XDG_RUNTIME_DIR": ENV["XDG_RUNTIME_DIR"]}
SIX = SCRIPTS / "six_metrics.py"
PRINTED = ("train_acc", "train_f1", "valid_loss", "valid_acc", "valid_f1", "valid_ppl")


class Pty:
    """``argv`` run on a pseudo-terminal of 120x40 whose every byte of output is kept raw."""

    def __init__(self, argv: list[str], cwd, env: dict) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: the pty is its terminal
            os.chdir(cwd)
            os.execve(argv[0], argv, env)
        fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        self.output = b""

    def read_until(self, wanted: bytes, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        while wanted not in self.output:
            if time.monotonic() > deadline:
                raise AssertionError(f"no {wanted!r} in the terminal's output; its end: {self.output[-2000:]!r}")
            ready, _, _ = select.select([self.fd], [], [], 0.5)
            if ready:
                try:
                    self.output += os.read(self.fd, 65536)
                except OSError:  # the child closed the terminal
                    break
        return self.output

    def close(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(self.pid, 0)
        os.close(self.fd)


def test_the_raw_terminal_output_carries_the_notification_when_the_run_ends(tmp_path):
    run_dir = tmp_path / "run"
    env = {**os.environ, **TERM_ENV}
    env.pop("TMUX", None)
    term = Pty([sys.executable, "-m", "ptdash.tui.cli", "--run-dir", str(run_dir), str(SIX), "--steps", "30",
                "--workers", "0"], tmp_path, env)
    try:
        out = term.read_until(b"\x1b]777;notify;ptdash run: run ended;finished at step 30 (exit 0)\x07", 180)
        start = out.index(b"\x1b]777;notify;")
        assert b"\x1b]9;ptdash run: run ended: finished at step 30 (exit 0)\x07" in out
        assert b"\x07\x07" in out[start:start + 200] or out[start:].split(b"\x07", 2)[1] == b""  # then the bell
        assert rundir.read_info(run_dir).status == "finished"
        os.write(term.fd, b"q")
        term.read_until(b"\x1b[?1049l", 30)  # the dashboard closes (the alternate screen left)
    finally:
        term.close()


def type_filter(tmux, placeholder: str, text: str) -> None:
    """``/``, then ``text`` in the filter box once it is up, then Enter. A busy machine may
    take keys before the box has the focus: until ``text`` shows alone in the box, clear it
    (ctrl+a, ctrl+k) and type again."""
    tmux.type("main", "/")
    tmux.wait_for("main", placeholder, 30)
    field = re.compile(rf"^ +{re.escape(text)}(\s{{2,}}|\s*$)", re.MULTILINE)
    deadline = time.monotonic() + 60
    tmux.type("main", text)
    while not field.search(tmux.screen("main")):
        assert time.monotonic() < deadline, tmux.screen("main")
        time.sleep(0.5)
        if not field.search(tmux.screen("main")):
            tmux.keys("main", "C-a", "C-k")
            tmux.type("main", text)
    tmux.keys("main", "Enter")


@pytest.fixture
def tmux(request):
    require_tmux()
    t = Terminal(request.node.name[:20])
    yield t
    t.close()


def test_the_metrics_tab_lists_every_printed_metric_and_a_filter_narrows_them(tmux, tmp_path):
    run_dir = tmp_path / "run"
    # COLUMNS and LINES as the window's: Textual takes them over the terminal's own size, and
    # the test process has them (80x24) from its imports.
    tmux.start("main", f"{PTDASH} --run-dir {run_dir} {SIX} --steps 40", tmp_path, width=120, height=40,
               env={**TERM_ENV, "COLUMNS": "120", "LINES": "40"})
    tmux.wait_for("main", "finished", 180)
    tmux.keys("main", "7")
    screen = tmux.wait_for("main", "series  ·", 30)
    for name in PRINTED:
        assert f"printed/{name}" in screen, screen
    assert "loss " in screen and "grad/norm_total" in screen  # ptdash's own series are there too
    type_filter(tmux, "regular expression", "valid")
    screen = tmux.wait_for("main", "/valid/ keeps 4", 30)
    for name in PRINTED:
        assert (f"printed/{name}" in screen) == name.startswith("valid_"), screen
    assert "grad/norm_total" not in screen


def test_the_runs_view_overlays_two_runs(tmux, tmp_path):
    """``ptdash`` alone lists the runs here; two marked and Enter: both drawn as ``show A B`` draws them."""
    from support.recorded_run import make_run

    root = tmp_path / "ptdash-runs"
    make_run(root, steps=300, status="finished", exit_code=0, name="baseline")
    make_run(root, steps=200, status="finished", exit_code=0, name="lr-3e-3", seed=3)
    tmux.start("main", PTDASH, tmp_path, width=120, height=40, env={**TERM_ENV, "COLUMNS": "120", "LINES": "40"})
    screen = tmux.wait_for("main", "2 runs here", 60)
    assert "baseline" in screen and "lr-3e-3" in screen and "finished" in screen
    assert "300" in screen and "200" in screen  # the steps
    type_filter(tmux, "filter: words in", "lr-3")
    screen = tmux.wait_for("main", "keeps 1", 30)
    assert "baseline" not in screen
    tmux.keys("main", "Escape")
    tmux.wait_for("main", "baseline", 30)
    tmux.keys("main", "Space")
    tmux.wait_for("main", "1 marked", 30)
    tmux.keys("main", "Space")
    tmux.wait_for("main", "2 marked", 30)
    tmux.keys("main", "Enter")
    screen = tmux.wait_for("main", "replay (read-only)", 60)
    # The compare table under the charts names both runs, and the loss chart overlays them.
    tmux.wait_for("main", re.compile(r"lr-3e-3[\s\S]*baseline|baseline[\s\S]*lr-3e-3"), 30)
    assert "by step" in tmux.screen("main")
