"""Helpers for integration tests: run real scripts through the real `ptdash` CLI and talk
to the engine over its real socket."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from ptdash.shared import rundir
from ptdash.shared.client import Client
from ptdash.shared.protocol import Ack, Command
from ptdash.shared.reader import StoreReader
from ptdash.shared.store import STORE_NAME

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"
REPO = Path(__file__).resolve().parents[2]
# A private runtime dir per test session: the tests' sockets and live-run registry never
# mix with the user's real runs (or another test session's). The list of every run
# (``ls --all``) lives under XDG_STATE_HOME, which conftest points at a temporary dir.
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore",
       "XDG_RUNTIME_DIR": tempfile.mkdtemp(prefix="ptd-")}


def ptdash(*args: str, cwd: Path, timeout: float = 120, env: dict | None = None,
           input: str | None = None) -> subprocess.CompletedProcess:
    """Run the ptdash command to completion (its stdin: ``input``, or nothing)."""
    return subprocess.run([sys.executable, "-m", "ptdash.tui.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=env or ENV,
                          **({"input": input} if input is not None else {"stdin": subprocess.DEVNULL}))


def wait_for(predicate, timeout: float = 30.0, interval: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class Run:
    """A run started with `ptdash --headless` in the background."""

    def __init__(self, tmp_path: Path, script: str | Path, *args: str, options: tuple = (),
                 env: dict | None = None, run_dir: Path | None = None) -> None:
        self.run_dir = run_dir or tmp_path / "run"
        self.out = open(tmp_path / "cli.out", "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ptdash.tui.cli", "--headless", "--run-dir", str(self.run_dir), *options,
             str(script), *args],
            cwd=tmp_path, stdout=self.out, stderr=subprocess.STDOUT, env=env or ENV, stdin=subprocess.DEVNULL)
        wait_for(lambda: (self.run_dir / "run.json").exists() and self.info().status == "running"
                 or self.proc.poll() is not None, 60, what="the engine to start")
        self.client = Client(self.info().socket, rundir.read_token(self.run_dir), name="test")
        self.client.connect()

    def info(self) -> dict:
        return rundir.read_info(self.run_dir)

    def send(self, name: str, value=None, timeout: float = 60) -> Ack:
        """Send a command and return its Ack."""
        cmd = Command(id=uuid.uuid4().hex[:8], name=name, value=value)
        self.client.send(cmd)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = self.client.recv(timeout=1)
            if isinstance(msg, Ack) and msg.id == cmd.id:
                return msg
        raise AssertionError(f"no ack for {name}")

    def store(self) -> StoreReader:
        return StoreReader(self.run_dir / STORE_NAME)

    def last_step(self, rank: int = 0) -> int:
        with self.store() as s:
            return s.last_step(rank) or 0

    def series(self, name: str, rank: int = 0) -> tuple[list[int], list]:
        with self.store() as s:
            return s.series(name, rank=rank)

    def walls(self, rank: int = 0) -> dict[int, float]:
        """Step -> the wall time it ended on ``rank``, as the engine recorded it."""
        with self.store() as s:
            return dict(zip(*s.walls(rank)))

    def resume_after_hold(self, paused: Ack, hold: float = 0.5, ranks: tuple[int, ...] = (0,)) -> Ack:
        """Resume the run ``paused`` paused, after checking by the steps' own end times (on
        every rank in ``ranks``) that none ran while it was paused: a slow flusher or a busy
        machine cannot fail this, a step that trained during the pause always does."""
        assert paused.ok, paused.message
        for rank in ranks:
            self.wait_step(paused.step, rank=rank)
        time.sleep(hold)  # a pause worth the name; the check does not depend on it
        sent = time.time()
        ack = self.send("resume")
        assert ack.ok and ack.step == paused.step, ack
        for rank in ranks:
            self.wait_step(paused.step + 1, rank=rank)
            walls = self.walls(rank)
            assert max(w for s, w in walls.items() if s <= paused.step) < sent, f"a step ended on rank {rank} while paused"
            assert min(w for s, w in walls.items() if s > paused.step) >= sent, f"a step ended on rank {rank} while paused"
            assert sorted(walls) == list(range(min(walls), max(walls) + 1)), rank
        return ack

    def wait_step(self, n: int, timeout: float = 60, rank: int = 0) -> int:
        return wait_for(lambda: self.last_step(rank) >= n and self.last_step(rank), timeout,
                        what=f"step {n} on rank {rank}")

    def wait(self, timeout: float = 60) -> int:
        code = self.proc.wait(timeout)
        self.close()
        return code

    def output(self) -> str:
        return (self.run_dir / "output.log").read_text()

    def close(self) -> None:
        """End the CLI and the engine (which lives in its own session and would outlive it)."""
        self.client.close()
        if self.proc.poll() is None:
            self.proc.kill()
        pid = engine_pid(self.run_dir)
        if pid:
            os.kill(pid, signal.SIGKILL)
        self.proc.wait()
        self.out.close()


def engine_pid(run_dir: Path) -> int | None:
    """The pid of this run's engine if it is still running, else None.

    A dead engine's pid may already belong to someone else's process on a busy machine,
    so the process must carry this run dir in its environment before anyone kills it.
    """
    try:
        pid = rundir.read_info(run_dir).pid
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if pid else []
    except (OSError, ValueError):
        return None
    return pid if f"PTDASH_RUN_DIR={run_dir}".encode() in environ else None


def processes_in(cwd: Path) -> list[int]:
    """Pids of the processes working in ``cwd`` (a test's own directory), other than the
    ``ptdash`` front: the engine, its ranks and whatever they started."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{entry}/cwd") == str(cwd) and \
                    b"ptdash.tui.cli" not in open(f"/proc/{entry}/cmdline", "rb").read():
                pids.append(int(entry))
        except OSError:
            continue
    return pids


def rank_pid(cwd: Path, rank: int, timeout: float = 60) -> int:
    """The pid of the training process of ``rank`` working in ``cwd`` (torchrun gives each
    its RANK in its environment; the launcher itself has none)."""
    def ranked():
        found = []
        for pid in processes_in(cwd):
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"RANK={rank}".encode() in environ:
                found.append(pid)
        return found
    (pid,) = wait_for(ranked, timeout, what=f"rank {rank}'s process")
    return pid


def kill_all(pids) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
