"""When the engine cannot answer a stop: the headless front kills the run itself.

A SIGTERM (``timeout``, a batch scheduler) asks the engine for a clean stop, and the
engine takes it on a thread of its own: the run's state turns ``stopping`` at once,
whatever the script is doing. A script inside a C call that holds the GIL (a native
extension's loop, ``sum(range(10**12))``) runs no Python thread, so nothing answers:
plain python would have died of the signal, and under ptdash the run would go on
forever. So the front waits for the answer (the stop grace period, and UNANSWERED_S
more) and then kills the run; a second signal kills it after KILL_WAIT_S whatever the
engine says. A run that answered is never killed for being slow: its checkpoint may
take minutes.

The last lines before a hang are the ones a user needs. The output relay's copier
(engine/outproc.py) is a process of its own, not as stuck as the rest: the kill leaves it
to copy what waits in the pipe to the pipe's end (COPIER_WAIT_S), then it ends by itself.
Without one (the copier on a thread of the engine, as stuck as the rest), or where it does
not end in time, what waits in the pipes is read from here and appended to output.log.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

from ptdash.shared import rundir
from ptdash.shared.exits import STOP_GRACE_S
from ptdash.shared.protocol import ENDED

_MARK = re.compile(rb"\x00\x1b.{14}[FTS].{8}", re.DOTALL)
"""The step marks engine/outmarks.py puts in the pipe (a prefix of two bytes no text holds
and 14 random ones, F or T, the step): the relay takes them out, and so does a drain."""
UNANSWERED_S = 10.0
"""Past the stop grace period, how long a stop may go unanswered before the run is killed."""
KILL_WAIT_S = 3.0
"""How long a second signal's kill command may take before the run is killed from here."""
COPIER_WAIT_S = 5.0
"""How long the output relay's copier may take to copy the pipe to its end once its writers are killed."""
COPIER = b"ptdash.outproc"
"""What the copier's command line holds (``python -m ptdash.outproc READ ...``)."""


class HardStop:
    """``asked(kind)`` when a stop or kill was sent; ``due()`` in the front's loop says when to
    kill (and what to say); ``kill()`` does it. The clock is injectable for tests."""

    def __init__(self, run_dir: Path, proc: subprocess.Popen, clock=time.monotonic) -> None:
        self._run_dir, self._proc, self._clock = run_dir, proc, clock
        self._at: float | None = None
        self._kind = ""

    def asked(self, kind: str) -> None:
        wait = KILL_WAIT_S if kind == "kill" else STOP_GRACE_S + UNANSWERED_S
        self._at, self._kind = self._clock() + wait, kind

    def due(self) -> str | None:
        """Why the run is to be killed now, or None."""
        if self._at is None or self._clock() < self._at or self._proc.poll() is not None:
            return None
        self._at = None
        if self._kind == "kill":
            return f"the run did not end within {KILL_WAIT_S:g} s of the kill"
        try:
            info = rundir.read_info(self._run_dir)
        except (OSError, ValueError):
            info = None
        if info is not None and (info.status == "stopping" or info.status in ENDED):
            return None  # it answered: its stop is under way (a checkpoint may take long)
        # Under DDP the stop waits for every rank at one step: a stalled rank never comes.
        why = (info.stalled.split(";")[0] if info is not None and info.stalled else
               "no Python thread of the script's process runs: a C call holding the GIL?")
        return f"the engine did not answer the stop within {STOP_GRACE_S + UNANSWERED_S:g} s ({why})"

    def kill(self) -> int:
        """Keep what the stuck relay could not copy, then SIGKILL the run's processes; the
        bytes kept."""
        return kill_tree(self._proc.pid, self._run_dir / "output.log")


def make_kill_good(run_dir: Path, why: str, by: str) -> bool | None:
    """After a kill command the engine did not take (``why``): kill the run's processes from
    here and record it in run.json (``by``: what killed it). True when killed, False when
    they were gone already, None when the process is not this run's (or on another machine)."""
    info = rundir.read_info(run_dir)
    pid = info.launcher_pid or info.pid
    if pid is None or not alive(pid):
        return False
    if not of_run(pid, run_dir):
        return None
    # Said before the kill: the front that started the engine says how it ended once it sees
    # it gone ('the engine was killed by SIGKILL'), unless run.json says already, and the kill
    # lets the copier end first (up to COPIER_WAIT_S), long after the front has seen it.
    if rundir.read_info(run_dir).status not in ENDED:
        rundir.update_info(run_dir, status="crashed", exit_code=-signal.SIGKILL, ended=time.time(),
                           detail=f"killed by {by}: {why}")
    kill_tree(pid, Path(run_dir) / "output.log")
    return True


def kill_tree(root: int, log_path: Path) -> int:
    """SIGKILL ``root`` and every process under it but the output relay's copier, which
    copies the pipe to its end once they are gone; where there is none, or it does not end
    within COPIER_WAIT_S, what waits in the pipes is appended to ``log_path`` from here
    first. The bytes kept from here."""
    pids = _tree(root)
    copiers = {pid: fd for pid in pids if (fd := _copier_fd(pid)) is not None}
    writers = [pid for pid in pids if pid not in copiers]
    kept = 0 if copiers else _drain(writers, log_path)
    _kill(writers)
    deadline = time.monotonic() + COPIER_WAIT_S
    while any(alive(pid) for pid in copiers) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid, fd in copiers.items():
        if alive(pid):  # stuck: what it has not read is read from here, then it goes too
            kept += _copy_pipe(f"/proc/{pid}/fd/{fd}", log_path)
            _kill([pid])
    return kept


def _kill(pids: list[int]) -> None:
    for pid in reversed(pids):  # the children first: none is left orphaned, running on
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _copier_fd(pid: int) -> int | None:
    """The pipe's read end in the output relay's copier ``pid`` (its first argument); None
    when ``pid`` is not a copier."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return None
    if COPIER not in argv:
        return None
    try:
        return int(argv[argv.index(COPIER) + 1])
    except (IndexError, ValueError):
        return None


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped by its parent, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def of_run(pid: int, run_dir: Path) -> bool:
    """Whether ``pid`` is a process ptdash started for ``run_dir`` (not a pid reused since)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read().split(b"\0")
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return False
    for entry in environ:
        if entry.startswith(b"PTDASH_RUN_DIR="):
            named = Path(cwd, os.fsdecode(entry[len(b"PTDASH_RUN_DIR="):]))
            return named.resolve() == Path(run_dir).resolve()
    return False


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants, parents before children."""
    out, todo = [], [pid]
    while todo:
        current = todo.pop(0)
        out.append(current)
        try:
            tasks = os.listdir(f"/proc/{current}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{current}/task/{task}/children") as f:
                    todo += [int(child) for child in f.read().split()]
            except (OSError, ValueError):
                pass
    return out


def _drain(pids: list[int], log_path: Path) -> int:
    """Append to ``log_path`` what waits in the pipes the processes' stdout and stderr are
    (each pipe once: the processes share them)."""
    seen, kept = set(), 0
    for pid in pids:
        for fd in (1, 2):
            path = f"/proc/{pid}/fd/{fd}"
            try:
                target = os.readlink(path)
            except OSError:
                continue
            if not target.startswith("pipe:") or target in seen:
                continue
            seen.add(target)
            kept += _copy_pipe(path, log_path)
    return kept


def _copy_pipe(path: str, log_path: Path) -> int:
    try:
        pipe = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return 0
    chunks = []
    try:
        while True:
            data = os.read(pipe, 1 << 16)
            if not data:
                break
            chunks.append(data)
    except (BlockingIOError, OSError):
        pass
    finally:
        os.close(pipe)
    data = _MARK.sub(b"", b"".join(chunks))
    if data:
        try:
            with open(log_path, "ab") as f:
                f.write(data)
        except OSError:
            return 0
    return len(data)
