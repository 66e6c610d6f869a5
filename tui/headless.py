"""The headless front: the script's output, a progress line every few seconds, the exit code.

What ``ptdash`` does when stdout is not a terminal (CI, a batch job, ``| tee``) or with
``--headless``: it copies output.log to stdout, prints a progress line read from the
store, says plainly what needs a person (an anomaly pause: what, where, and the commands
that answer it; a full disk), and waits for the run to end.

Signals mean what they mean elsewhere: SIGINT (Ctrl-C) and SIGTERM (``timeout``, a batch
scheduler) stop the run cleanly, with a checkpoint; a second one kills it, and a stop the
engine cannot answer (no Python thread of it runs) ends in a kill from here (hardstop.py). SIGHUP (the
terminal went away) detaches: the run goes on by itself. A front that dies any other way
(SIGKILL, a crash) closes its link and the engine stops the run cleanly. Output errors
(a closed pipe) never stop any of this: the front then only stops printing.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from contextlib import nullcontext
from pathlib import Path

from ptdash.shared import rundir
from ptdash.shared.config import RunInfo
from ptdash.shared.exits import describe_exit
from ptdash.shared.frontlink import NOTICE, OUTPUT, FrontLink
from ptdash.shared.protocol import ENDED, Command, TransportError
from ptdash.shared.reader import wait_for_store
from ptdash.shared.store import STORE_NAME

from .ctl import send_command
from .hardstop import HardStop
from .watch import Watcher, anomalies_said, progress_line

REPEAT_S = 0.5
"""A second SIGINT/SIGTERM this soon after the first is the same one: ``timeout`` and a
terminal's process group deliver one stop twice at once. Later, a second one kills."""


class _Out:
    """stdout that never raises: a reader that went away (``| head``, a dead ``tee``)
    turns the printing off, never the run's stop.

    The script's output (``script``) and ptdash's own lines (``line``) share it. A line of
    ptdash's that comes while the script is inside a line (its ``print`` wrote the text,
    not yet the newline) starts on a line of its own, and the script's newline, when it
    comes next, is not written again: "loss 0.07[ptdash] no space left..." never happens.
    """

    def __init__(self) -> None:
        self.broken = False
        self._mid_line = False
        """The script's output stopped inside a line."""
        self._owed = False
        """ptdash ended the script's line for it: the script's own newline is dropped if it comes next."""

    def script(self, data: bytes) -> None:
        if not data:
            return
        if self._owed and data.startswith(b"\n"):
            data = data[1:]
        self._owed = False
        if data:
            self._mid_line = not data.endswith(b"\n")
            self.write(data)

    def line(self, data: bytes) -> None:
        if self._mid_line:
            data = b"\n" + data
            self._mid_line, self._owed = False, True
        self.write(data)

    def write(self, data: bytes) -> None:
        if self.broken or not data:
            return
        try:
            sys.stdout.buffer.write(data)
            sys.stdout.flush()
        except (OSError, ValueError):
            self.broken = True
            try:  # what is still buffered would raise again at exit
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            except OSError:
                pass


OUT = _Out()


def say(line: str) -> None:
    """Print one of ptdash's lines (never raises)."""
    OUT.line((line + "\n").encode("utf-8", "backslashreplace"))


def headless(run_dir: Path, proc: subprocess.Popen, every: float = 5.0, link: socket.socket | None = None,
             pause_timeout: float | None = None) -> int:
    """Stream the script's output, print a progress line every ``every`` s, return its exit code
    (negative: the signal that ended it, as subprocess reports it).

    ``link`` is the front's end of the engine's link (shared/frontlink.py);
    ``pause_timeout`` is the run's, for the words about a pause.
    """
    front = FrontLink(link) if link is not None else None
    signals = {"count": 0, "at": 0.0, "hangup": False}
    hard = HardStop(run_dir, proc)

    def on_stop(signum, _frame):
        now = time.monotonic()
        if signals["count"] and now - signals["at"] < REPEAT_S:
            return  # the same stop, sent twice (``timeout`` signals the child and its group)
        signals["count"] += 1
        signals["at"] = now
        name = "stop" if signals["count"] == 1 else "kill"
        if name == "kill":
            try:  # the run may have ended already, its process still closing (torch's teardown)
                info = rundir.read_info(run_dir)
            except (OSError, ValueError):
                info = None
            if info is not None and info.status in ENDED and info.exit_code is not None:
                signals["ended"] = (info.status, info.exit_code)
        # The command first: printing may fail (a closed pipe), the stop must not.
        hard.asked(name)
        try:
            send_command(run_dir, Command(id=uuid.uuid4().hex[:8], name=name), wait=False)
        except (TransportError, OSError, ValueError):
            try:  # no socket yet (the engine is still starting): the engine stops on SIGTERM too
                proc.send_signal(signal.SIGTERM if name == "stop" else signal.SIGKILL)
            except OSError:
                pass
        what = signal.Signals(signum).name
        # Past the terminal's "^C" (not in the output: ptdash's lines start lines of their own).
        lead = "\n" if signum == signal.SIGINT and _is_terminal() else ""
        if name == "stop":
            say(f"{lead}[ptdash] {what}: stopping cleanly after this step, with a checkpoint ({what} again to kill)")
        elif signals.get("ended"):
            state, code = signals["ended"]
            say(f"{lead}[ptdash] {what} again: the run had already ended ({state}, exit code {code}); "
                "killing what was left of its process")
        else:
            say(f"{lead}[ptdash] {what} again: killing the run")

    def on_hangup(*_):
        signals["hangup"] = True

    handlers = {signal.SIGINT: on_stop, signal.SIGTERM: on_stop, signal.SIGHUP: on_hangup}
    previous = {sig: signal.signal(sig, fn) for sig, fn in handlers.items()}
    log_path = run_dir / "output.log"
    offset, last_progress = 0, time.monotonic()
    watcher = Watcher(run_dir, pause_timeout, front is not None, say)
    try:
        while True:
            code = proc.poll()
            offset = _copy_new(log_path, offset)
            if front is not None:
                watcher.disk_full |= _print_frames(front)
            if code is not None:
                break
            if signals["hangup"]:
                if front is not None:
                    front.detach()
                say(f"[ptdash] the terminal went away: training goes on by itself; watch it with: "
                    f"ptdash attach {run_dir}")
                return -signal.SIGHUP
            why = hard.due()
            if why is not None:
                kept = hard.kill()
                signals["killed"] = why
                say(f"[ptdash] {why}: killing it" + (f" ({kept} bytes of its output, which the engine "
                                                      "could not copy, kept in output.log)" if kept else ""))
            due = time.monotonic() - last_progress >= every
            watcher.poll(due)
            if due:
                last_progress = time.monotonic()
            time.sleep(0.2)
    finally:
        for sig, fn in previous.items():
            signal.signal(sig, fn)
    watcher.poll(True, final=True)
    if signals.get("ended") and code == -signal.SIGKILL:
        code = signals["ended"][1]  # killed after its end was recorded: the run's own exit code
    info = _ended(run_dir, code, signals.get("killed"))
    with wait_for_store(run_dir / STORE_NAME, 1) or nullcontext() as reader:
        line = progress_line(reader, info, status=False) if reader else ""
        told = anomalies_said(reader, run_dir) if reader else ""
    say(f"[ptdash] {info.status} ({describe_exit(code)})" + (f"; {line.removeprefix('[ptdash] ')}" if line else "")
        + told + f"\n[ptdash] run dir: {run_dir}")
    return code


def _is_terminal() -> bool:
    try:
        return os.isatty(sys.stdout.fileno())
    except (OSError, ValueError):
        return False


def _ended(run_dir: Path, code: int, killed: str | None = None) -> RunInfo:
    """run.json once the engine has exited: an engine killed from outside (the OOM killer,
    SIGKILL, this front: ``killed`` says why) could not say how it ended, so its parent says it."""
    info = rundir.read_info(run_dir)
    if info.status in ENDED:
        return info
    if killed:
        detail = f"killed by ptdash: {killed}"
    elif code < 0:
        detail = f"the engine was {describe_exit(code)}"
    else:
        detail = f"the engine exited with code {code} before recording how the run ended"
    try:
        info = rundir.update_info(run_dir, status="crashed", exit_code=code, ended=time.time(), detail=detail)
        rundir.unregister(info.id)
    except (OSError, ValueError):
        pass
    return info


def _copy_new(path: Path, offset: int) -> int:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return offset
    OUT.script(data)
    return offset + len(data)


def _print_frames(front: FrontLink) -> bool:
    """What the engine sent over the link: output the disk could not take, and notices.
    Returns whether one named a full disk."""
    full = False
    for kind, payload in front.frames():
        if kind == OUTPUT:
            OUT.script(payload)
        elif kind == NOTICE:
            text = payload.decode("utf-8", "replace")
            full |= text.startswith("no space left")
            say(f"[ptdash] {text}")
    return full


