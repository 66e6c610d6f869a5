"""The script's stdout and stderr, relayed so that a full disk never fails a ``print``, and
read for the metrics it prints.

The ``ptdash`` command starts the engine with stdout and stderr on output.log. Written
there directly, a full disk makes the script's own ``print`` raise and kills the run.
Instead, fds 1 and 2 become a pipe whose reader, the copier (outproc.py: a process of its
own, so that neither its reads nor the parse take the training thread's GIL), copies it
to output.log and reads it for metrics. What the file cannot take is counted, handed to
the headless front over its link (so it still streams), and the full disk is named once.

Here, a thread (``ptdash-output``) applies what the copier says: a metric found, bytes
read in a step (``StepState.out_dirty``), a full disk. It sleeps on the copier's pipe
otherwise. The pipe's read end stays open here too, so a print never meets a closed pipe:
should the copier die (or fail to start), that thread copies in its place. A copier that
is slow costs at most the pipe's buffer before the script's writes wait, as a slow disk would.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import subprocess
import sys
import threading
import warnings

from .outmarks import Marks, new_prefix, sync_mark
from .outproc import Copier, read_frames
from .shared import diskspace

log = logging.getLogger("ptdash.output")

ENV = "PTDASH_OUTPUT_RELAY"
"""Set by the ``ptdash`` command when fds 1 and 2 are output.log."""
PIPE_BYTES = 1 << 20
"""The pipe's size asked for (Linux's most for a user, by default): a flood waits less for the relay."""
SYNC_S = 5.0
"""How long ``close`` waits for the copier to have copied what was written before it."""


class OutputRelay:
    """Fds 1 and 2 on a pipe that the copier reads; see the module docstring. ``to_file``:
    write output.log itself (a rank ptdash did not start); ``parse``: read the output for
    metrics; ``process``: the copier in a process of its own (else on this process's thread)."""

    def __init__(self, run_dir, link=None, to_file: bool = False, parse: bool = True, process: bool = True) -> None:
        self.run_dir = run_dir
        self.link = link
        self.unwritten = 0
        """Bytes of output that output.log could not take."""
        # A rank ptdash did not start (``for_rank``) writes to output.log itself: its fds 1
        # and 2 are the hub's pipe, whose relay would read its output as the hub's own.
        self._log = os.open(os.path.join(run_dir, "output.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600) \
            if to_file else os.dup(1)
        os.set_inheritable(self._log, False)
        self._restore = os.dup(1) if to_file else self._log
        """What fds 1 and 2 are again when the relay closes."""
        os.set_inheritable(self._restore, False)
        self._read, self._write_end = os.pipe()
        """The pipe's ends: the read end kept for a copier here; the write end for the marks
        (``follow``) and the sync at ``close``."""
        _grow(self._write_end)
        self.prefix = new_prefix()
        """The marks' prefix, the copier's to take out."""
        self._parse = parse
        self.printed = None
        """The metrics the script prints (printed.PrintedMetrics, given by ``follow``)."""
        self._state = None
        self._marks: Marks | None = None
        self._synced = threading.Event()
        self.reached_end = False
        """Whether the copier copied to the pipe's end (no writer left), as it says last."""
        self._closing = False
        self.copier: subprocess.Popen | None = self._spawn() if process else None
        os.dup2(self._write_end, 1)
        os.dup2(self._write_end, 2)
        target = self._receive if self.copier is not None else self._copy_here
        self._thread = threading.Thread(target=target, name="ptdash-output", daemon=True)
        self._thread.start()

    @classmethod
    def start(cls, run_dir, link=None, parse: bool = True) -> OutputRelay | None:
        """Relay fds 1 and 2 when the ``ptdash`` command put them on output.log."""
        if os.environ.pop(ENV, None) != "1" or run_dir is None:
            return None
        try:
            return cls(run_dir, link, parse=parse)
        except OSError:
            log.exception("cannot relay the script's output; it goes to output.log directly")
            return None

    @classmethod
    def for_rank(cls, run_dir) -> OutputRelay | None:
        """A rank that ptdash did not start (rankstart.py) relays its own output, read for
        its metrics at its own steps; straight to output.log, never through the hub's pipe."""
        try:
            return cls(run_dir, to_file=True)
        except OSError:
            log.exception("cannot relay this rank's output; its printed metrics are not read")
            return None

    def _spawn(self) -> subprocess.Popen | None:
        """The copier's process, reading the pipe; None where it cannot start (a thread copies)."""
        back, back_write = os.pipe()
        try:
            with open(os.path.join(self.run_dir, "engine.log"), "ab") as errors:  # its own errors, if any
                proc = subprocess.Popen(
                    [sys.executable, "-m", "ptdash.outproc", str(self._read), str(self._log), str(back_write),
                     self.prefix.hex(), "1" if self._parse else "0"],
                    pass_fds=(self._read, self._log, back_write), stdin=subprocess.DEVNULL, stdout=errors,
                    stderr=errors, start_new_session=True, cwd="/")  # it holds no directory of the user's
        except OSError:
            log.exception("cannot start the output relay's process; a thread of this one copies the output")
            os.close(back)
            return None
        finally:
            os.close(back_write)
        self._back = back
        return proc

    def follow(self, printed, state) -> None:
        """Read the output for the metrics it prints (``printed``: printed.PrintedMetrics),
        each line at the step it was written at: the output is marked (outmarks.py) by the
        script's streams and at the steps' boundaries (``state``: stepstate.StepState)."""
        if printed is None:
            return
        self._state = state
        self.printed = printed
        try:
            self._marks = Marks(self._write_end, state, prefix=self.prefix)
        except OSError:
            log.exception("cannot mark the script's output: its lines are kept at the step they are read at")

    # ------------------------------------------------------------- the relay's thread

    def _receive(self) -> None:
        """The copier's frames, applied; at their end (the copier gone), the copying goes on here."""
        for kind, body in read_frames(self._back):
            try:
                if kind == b"D":
                    self.dirty()
                elif kind == b"V":
                    step, found, line = json.loads(body)
                    self.take([tuple(pair) for pair in found], self._now() if step is None else step, line)
                elif kind == b"O":
                    self.unwritten_bytes(body)
                elif kind == b"N":
                    self.notice(*json.loads(body))
                elif kind == b"S":
                    self.synced(int(body))
                elif kind == b"E":
                    self.ended()
            except Exception:  # noqa: BLE001 - a frame must not end the relay
                log.exception("the output relay's frame %r could not be applied", kind)
        os.close(self._back)
        proc, code = self.copier, "unknown"
        if proc is not None:
            try:  # it exits at once after its last frame; a script that reaps every child leaves no code
                code = proc.wait(1.0)
            except subprocess.TimeoutExpired:
                pass
        if self.reached_end:
            return  # it copied to the pipe's end: no writer is left
        log.warning("the output relay's process ended (exit code %s); a thread of this one copies the output", code)
        self._copy_here()

    def _copy_here(self) -> None:
        Copier(self._read, self._log, self.prefix, self, parse=self._parse, now=self._now).run()

    def _now(self) -> int:
        printed = self.printed
        return printed.now() if printed is not None else 0

    # The sinks of a Copier (outproc.py), called by the frames or by a Copier on this thread.

    def take(self, found: list, step: int, line: str) -> None:
        if self.printed is not None:
            self.printed.take(found, step, line)

    def dirty(self) -> None:
        if self._marks is not None:
            self._state.out_dirty = True  # the next boundary marks where the bytes of this step end

    def unwritten_bytes(self, data: bytes) -> None:
        self.unwritten += len(data)
        if self.link is not None:
            self.link.output(data)

    def notice(self, kind: str, text: str) -> None:
        if kind == "full":
            diskspace.NOTICE.full(self.run_dir, text)
        elif kind == "room":
            diskspace.NOTICE.room_again(text)
        else:
            diskspace.NOTICE.say(text)

    def synced(self, n: int) -> None:
        self._synced.set()

    def ended(self) -> None:
        self.reached_end = True

    # ------------------------------------------------------------- the end

    def close(self, timeout: float = SYNC_S) -> None:
        """Point fds 1 and 2 back at output.log, wait until what was written before is copied
        and read, say what was lost. A process the script left running (persistent DataLoader
        workers) may hold the pipe still: what it writes later is copied as it comes."""
        if self._closing:
            return
        self._closing = True
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        if self._marks is not None:
            self._marks.close()
        os.dup2(self._restore, 1)
        os.dup2(self._restore, 2)
        try:
            os.write(self._write_end, sync_mark(self.prefix, 1))
        except OSError:
            pass
        os.close(self._write_end)
        if not self._synced.wait(timeout):
            log.warning("the output relay did not copy the output to its end within %g s", timeout)
        self._let_go()
        if self.unwritten:
            diskspace.NOTICE.say(f"{diskspace.fmt_bytes(self.unwritten)} ({self.unwritten} bytes) of the script's "
                                 "output could not be written to output.log")
        if self.link is not None:
            self.link.flush()


    def _let_go(self) -> None:
        """A copier that outlives the close (a process the script left running holds the pipe)
        is let go, to end when the pipe does: its Popen dropped without the ResourceWarning
        a running child's gets (subprocess keeps it, to be reaped later)."""
        if self.copier is None:
            return
        self._thread.join(0.2)  # the copier's last frame, and the thread's wait for its exit
        if self.copier.returncode is None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", ResourceWarning)
                self.copier = None


def _grow(fd: int) -> None:
    """Make the pipe of ``fd`` PIPE_BYTES big where the system lets it."""
    try:
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    except (OSError, AttributeError):  # a smaller limit, or not Linux: 64 KB
        pass
