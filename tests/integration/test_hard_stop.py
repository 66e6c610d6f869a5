"""A stop nobody can answer, through the real CLI: the script sits in a C call that holds
the GIL, so no thread of its process runs Python (tui/hardstop.py).

Plain python dies of a SIGTERM there; under ptdash the engine's stop needs Python, so the
headless front kills the run itself once the stop goes unanswered, keeps what the script
wrote before it hung, and leaves no process behind. Every wait is on something observable
(a file the script writes, a line of the front's, a process's exit).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ptdash import outmarks
from ptdash.shared import rundir
from ptdash.tui.app import make_app
from ptdash.tui.hardstop import HardStop
from ptdash.tui.hardstop import alive as _alive
from ptdash.tui.source.live import LiveSource
from ptdash.tui.widgets.stop_dialog import StopDialog
from support.pilot import screen_text, until
from support.runner import ENV, wait_for

CLI = [sys.executable, "-m", "ptdash.tui.cli"]
HANGS = """\
import os, sys, torch
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(20):
    opt.zero_grad()
    model(torch.randn(8, 4)).sum().backward()
    opt.step()
sys.stdout.write("the last line before the hang\\n")
sys.stdout.flush()
open(sys.argv[1], "w").close()
sum(range(10 ** 15))  # one C call: the GIL is never let go
"""


def _end(pids) -> None:
    """Whatever a failed test left running."""
    for pid in pids:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def _start(tmp_path: Path, grace: str):
    script = tmp_path / "hangs.py"
    script.write_text(HANGS)
    out = open(tmp_path / "front.out", "wb")
    proc = subprocess.Popen([*CLI, "--headless", "--run-dir", str(tmp_path / "run"), str(script),
                             str(tmp_path / "entered")], cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env={**ENV, "PTDASH_STOP_GRACE": grace})
    wait_for(lambda: (tmp_path / "entered").exists(), 120, what="the script to enter its C call")
    return proc, rundir.read_info(tmp_path / "run").pid


def test_an_unanswerable_stop_kills_the_run_and_keeps_its_last_output(tmp_path):
    proc, engine = _start(tmp_path, grace="1")
    try:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(180)
        text = (tmp_path / "front.out").read_text()
        assert code == 128 + signal.SIGKILL, text[-2000:]
        assert "the engine did not answer the stop within 11 s" in text
        assert not _alive(engine)  # nothing left running at 100% CPU
        info = rundir.read_info(tmp_path / "run")
        assert info.status == "crashed" and info.detail.startswith("killed by ptdash: the engine did not answer")
        assert "the last line before the hang" in (tmp_path / "run" / "output.log").read_text()
        assert "the last line before the hang" in text
    finally:
        _end((proc.pid, engine))


def test_a_second_signal_kills_at_once_whatever_the_engine_says(tmp_path):
    proc, engine = _start(tmp_path, grace="600")  # the unanswered stop alone would wait 10 min
    try:
        proc.send_signal(signal.SIGTERM)
        wait_for(lambda: b"stopping cleanly" in (tmp_path / "front.out").read_bytes(), 60, what="the stop")
        time.sleep(0.6)  # past REPEAT_S, the span in which a second signal is the same one
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(120)
        text = (tmp_path / "front.out").read_text()
        assert code == 128 + signal.SIGKILL, text[-2000:]
        assert "SIGTERM again: killing the run" in text, text[-2000:]
        assert not _alive(engine)
        # The kill went as a command the engine never read, made good from here after 3 s, or,
        # when the command could not even be sent (its socket's backlog, a loaded machine), as
        # SIGKILL at once: either way the run is recorded killed.
        info = rundir.read_info(tmp_path / "run")
        assert info.status == "crashed" and "SIGKILL" in (info.detail or "") + text, (info, text[-2000:])
    finally:
        _end((proc.pid, engine))


MARK = outmarks.new_prefix() + b"F" + (7).to_bytes(8, "big")
"""A step mark as the engine writes one into the pipe (engine/outmarks.py)."""


def test_the_kill_keeps_what_waits_in_the_pipe_and_kills_the_children_too(tmp_path):
    # A process whose output nobody reads (the stuck relay) and a child of its own: what it
    # wrote reaches output.log without the engine's step marks, and neither process is left.
    code = ("import os, subprocess, sys, time\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
            f"os.write(1, b'unread ' + {MARK!r} + b'output\\n')\n"
            "open(sys.argv[1], 'w').write(str(child.pid))\n"
            "time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "child")], stdout=subprocess.PIPE)
    try:
        wait_for(lambda: (tmp_path / "child").exists() and (tmp_path / "child").read_text(), 60, what="the child")
        child = int((tmp_path / "child").read_text())
        stop = HardStop(tmp_path, proc, clock=lambda: 0.0)
        assert stop.kill() == len(b"unread output\n")
        assert (tmp_path / "output.log").read_bytes() == b"unread output\n"
        proc.wait(30)
        wait_for(lambda: not _alive(child), 30, what="the child to die")
    finally:
        proc.kill()
        proc.wait()


DDP_HANGS = """\
import sys, torch, torch.distributed as dist
dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(1000):
    if step == 10 and dist.get_rank() == 1:
        open(sys.argv[1], "w").close()
        sum(range(10 ** 15))  # rank 1 holds its GIL; rank 0 waits for it in backward
    opt.zero_grad()
    model(torch.randn(8, 4)).sum().backward()
    opt.step()
"""


def test_under_ddp_a_stop_a_stalled_rank_blocks_kills_every_rank(tmp_path):
    script = tmp_path / "ddp_hangs.py"
    script.write_text(DDP_HANGS)
    out = open(tmp_path / "front.out", "wb")
    proc = subprocess.Popen([*CLI, "--headless", "--run-dir", str(tmp_path / "run"), "--nproc-per-node", "2",
                             "--stall-timeout", "2", str(script), str(tmp_path / "entered")], cwd=tmp_path,
                            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env={**ENV, "PTDASH_STOP_GRACE": "1"})
    try:
        wait_for(lambda: (tmp_path / "entered").exists(), 180, what="rank 1 to enter its C call")
        wait_for(lambda: rundir.read_info(tmp_path / "run").stalled, 120, what="the stall")
        ranks = _children(proc.pid)
        assert len(ranks) >= 2, ranks  # the launcher's two ranks (and what they started)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(180)
        text = (tmp_path / "front.out").read_text()
        assert code == 128 + signal.SIGKILL, text[-2000:]
        assert "did not answer the stop within 11 s (rank 1 stalled" in text
        wait_for(lambda: not any(_alive(pid) for pid in ranks), 30, what="every rank to be gone")
    finally:
        _end((proc.pid, *_children(proc.pid)))


def _children(pid: int) -> list[int]:
    """Every process under ``pid`` (the launcher's ranks), from /proc."""
    out, todo = [], [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*"):
            try:
                found = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            out += found
            todo += found
    return out


def test_ctl_kill_kills_a_run_whose_engine_cannot_take_it(tmp_path):
    # ``ptdash ctl RUN kill`` from another terminal: the engine cannot even answer the
    # handshake, so the kill is made good from there, and it says so (never "killed" if not).
    proc, engine = _start(tmp_path, grace="600")
    try:
        result = subprocess.run([*CLI, "ctl", str(tmp_path / "run"), "kill"], cwd=tmp_path, env=ENV,
                                capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "killed from here (the engine did not take the kill" in result.stdout
        assert proc.wait(60) == 128 + signal.SIGKILL
        assert not _alive(engine)
        info = rundir.read_info(tmp_path / "run")
        assert info.status == "crashed" and info.detail.startswith("killed by ptdash ctl kill"), info
    finally:
        _end((proc.pid, engine))


WAITS_THEN_HANGS = """\
import os, sys, time, torch
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
step = 0
while not os.path.exists(sys.argv[1]):  # steps until the test says go
    opt.zero_grad()
    model(torch.randn(8, 4)).sum().backward()
    opt.step()
    step += 1
    time.sleep(0.01)
open(sys.argv[2], "w").close()
sum(range(10 ** 15))
"""


def test_the_dashboards_kill_is_made_good_when_the_engine_cannot_take_it(tmp_path):
    script = tmp_path / "waits.py"
    script.write_text(WAITS_THEN_HANGS)
    go, entered, run_dir = tmp_path / "go", tmp_path / "entered", tmp_path / "run"
    front = subprocess.Popen([*CLI, "--headless", "--run-dir", str(run_dir), str(script), str(go), str(entered)],
                             cwd=tmp_path, stdout=open(tmp_path / "front.out", "wb"), stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, env={**ENV, "PTDASH_STOP_GRACE": "600"})
    wait_for(lambda: (run_dir / "run.json").exists() and rundir.read_info(run_dir).step, 120, what="a step")
    engine = rundir.read_info(run_dir).pid

    async def scenario():
        app = make_app(LiveSource(run_dir))
        async with app.run_test(size=(120, 36)) as pilot:
            await until(pilot, lambda: app.source.can_control, what="the dashboard's connection")
            go.touch()
            await until(pilot, entered.exists, what="the script to enter its C call")
            await pilot.press("s")
            await until(pilot, lambda: isinstance(app.screen, StopDialog), what="the stop dialog")
            await pilot.press("k")
            await until(pilot, lambda: "killed from here" in screen_text(app), timeout=60, what="the kill made good")
            await pilot.press("q")

    try:
        asyncio.run(scenario())
        assert front.wait(60) == 128 + signal.SIGKILL
        assert not _alive(engine)
        assert rundir.read_info(run_dir).detail.startswith("killed by the dashboard's kill")
    finally:
        _end((front.pid, engine))
