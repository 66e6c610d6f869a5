"""The script's stdout and stderr, relayed so that a full disk never fails a ``print``.

The ``ptdash`` command starts the engine with stdout and stderr on output.log. Written
there directly, a full disk makes the script's own ``print`` raise and kills the run.
Instead, fds 1 and 2 become a pipe that a thread of this process (``ptdash-output``)
copies to output.log. What the file cannot take is counted, handed to the headless
front over its link (so it still streams), and the full disk is named once.

The pipe's reader lives as long as the writers that matter (the script's own process),
so a print never meets a closed pipe; a relay thread that is slow costs at most the
pipe's buffer before the script's writes wait, as a slow disk would.
"""

from __future__ import annotations

import fcntl
import logging
import os
import select
import struct
import sys
import termios
import threading
import time

from .outmarks import Marks, Splitter
from .shared import diskspace

log = logging.getLogger("ptdash.output")

ENV = "PTDASH_OUTPUT_RELAY"
"""Set by the ``ptdash`` command when fds 1 and 2 are output.log."""
BATCH_S = 0.1
"""Longest the output is held for the parser before output.log gets it."""
BATCH_BYTES = 1 << 18
"""Most output held for the parser at once."""
READ_BYTES = 1 << 16
"""Most bytes a read takes: a flood comes in reads of this, one batch for the parser each
few (BATCH_BYTES), so that a line printed every few dozen steps is never a frequent one
there (printread.FREQUENT)."""
PIPE_BYTES = 1 << 20
"""The pipe's size asked for (Linux's most for a user, by default): a flood waits less for the relay."""
NAP_S = 0.005
"""After a read that found the pipe far from full, how long the relay waits before the next:
each read takes the GIL from the training thread, and a script printing at every step
would otherwise hand it over at every write."""


class OutputRelay:
    """Copies the script's output from a pipe to output.log; see the module docstring."""

    def __init__(self, run_dir, link=None, to_file: bool = False) -> None:
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
        read, write = os.pipe()
        self._read = read
        _grow(write)
        os.dup2(write, 1)
        os.dup2(write, 2)
        self._write_end = write
        """The pipe's own write end, for the marks (``follow``); closed with the relay."""
        self._failing = False
        self.printed = None
        """The metrics the script prints (printed.PrintedMetrics, given by ``follow``):
        what is copied is shown to it, on this thread, never the training thread: at once
        after a quiet while, else in batches (at most one each BATCH_S, or BATCH_BYTES): a
        parse has a fixed cost, and a script printing at every step would pay it at every
        step, taken from the training thread as the GIL."""
        self._marks: Marks | None = None
        self._split: Splitter | None = None
        self._state = None
        self._held: list[tuple[int, bytes]] = []
        self._size = 0
        self._due = self._last = 0.0
        """When the held output is due to the parser; when it last got some."""
        self._lock = threading.Lock()
        os.set_blocking(read, False)
        self._thread = threading.Thread(target=self._loop, name="ptdash-output", daemon=True)
        self._thread.start()

    @classmethod
    def start(cls, run_dir, link=None) -> OutputRelay | None:
        """Relay fds 1 and 2 when the ``ptdash`` command put them on output.log."""
        if os.environ.pop(ENV, None) != "1" or run_dir is None:
            return None
        try:
            return cls(run_dir, link)
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

    def follow(self, printed, state) -> None:
        """Read the output for the metrics it prints (``printed``: printed.PrintedMetrics),
        each line at the step it was written at: the output is marked (outmarks.py) by the
        script's streams and at the steps' boundaries (``state``: stepstate.StepState)."""
        if printed is None:
            return
        with self._lock:
            try:
                self._marks = Marks(self._write_end, state)
            except OSError:
                log.exception("cannot mark the script's output: its lines are kept at the step they are read at")
                self._split = None
            else:
                self._split = Splitter(self._marks.prefix, printed.now)
            self._state = state
            self.printed = printed

    def _loop(self) -> None:
        while True:
            # With a batch held for the parser, wait no longer than it may be held.
            timeout = max(0.0, self._due - time.monotonic()) if self._held else None
            try:
                ready = select.select([self._read], [], [], timeout)[0]
            except InterruptedError:
                continue
            except (OSError, ValueError):
                self._release()
                return
            # Read and written under the lock: close() then knows that an empty pipe
            # means everything written before it has been handled.
            with self._lock:
                if not ready:
                    self._release()
                    continue
                try:
                    data = os.read(self._read, READ_BYTES)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    self._release()
                    return
                if not data:
                    self._release()
                    return
                self._take(data)
            if len(data) < READ_BYTES >> 2:
                time.sleep(NAP_S)

    def _take(self, data: bytes) -> None:
        """A read's bytes: to output.log, through the parser where there is one. Under the lock."""
        if self.printed is None:
            self._write(data)
            return
        pieces = self._pieces(data)
        if not pieces:  # marks alone
            return
        if not self._held:  # output after a quiet while is read at once, a flood in batches
            self._due = self._last + BATCH_S
        self._held += pieces
        self._size += len(data)
        if self._size >= BATCH_BYTES or time.monotonic() >= self._due:
            self._release()

    def _pieces(self, data: bytes) -> list[tuple[int, bytes]]:
        """A read's bytes, without marks, in pieces each with the step it was written at."""
        split = self._split
        if split is None:
            return [(self.printed.now(), data)]  # at the step in progress when read
        pieces = split.split(data)
        if split.held and not _unread(self._read):  # a mark's rest would be in the pipe: the script's bytes
            pieces += split.release()
        if pieces:
            self._state.out_dirty = True  # the next boundary marks where the bytes of this step end
        return pieces

    def _release(self) -> None:
        """The output held for the parser: read for metrics (each piece at the step it was
        read at; output.log, which a script may wait on, is written after). Under the lock."""
        if not self._held:
            return
        held, self._held, self._size, self._last = self._held, [], 0, time.monotonic()
        printed = self.printed
        if printed is not None:
            printed.feed_pieces(held)  # never raises: the output goes on whatever a line holds
        self._write(b"".join(data for _, data in held))

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self._log, view):]
        except OSError as exc:
            rest = bytes(view)
            self.unwritten += len(rest)
            if self.link is not None:
                self.link.output(rest)
            if not self._failing:
                self._failing = True
                if diskspace.is_full(exc):
                    diskspace.NOTICE.full(self.run_dir, "output.log cannot be written: the script's output "
                                                        "still streams to the front, and what is not written is counted")
                else:
                    diskspace.NOTICE.say(f"output.log cannot be written ({exc}): the script's output still "
                                         "streams to the front, and what is not written is counted")
            return
        if self._failing:
            self._failing = False
            diskspace.NOTICE.room_again(f"output.log is written again; {self.unwritten} bytes of the script's "
                                        "output could not be written to it")

    def close(self, timeout: float = 5.0) -> None:
        """Point fds 1 and 2 back at output.log, copy what the pipe still holds, say what was lost."""
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        if self._marks is not None:
            self._marks.close()
        os.dup2(self._restore, 1)
        os.dup2(self._restore, 2)
        os.close(self._write_end)
        # Copy what was written before now. End-of-file would wait for every writer, and a
        # process the script left running (persistent DataLoader workers) may hold the
        # pipe: the thread goes on copying what such a process writes later.
        deadline = time.monotonic() + timeout
        while self._thread.is_alive() and time.monotonic() < deadline:
            with self._lock:
                if not _unread(self._read):
                    break
            time.sleep(0.005)
        with self._lock:
            if self._split is not None and self._split.held:
                self._held += self._split.release()
            self._release()
            if self.printed is not None:
                self.printed.finish()  # an unfinished last line counts as it stands
        if self.unwritten:
            diskspace.NOTICE.say(f"{diskspace.fmt_bytes(self.unwritten)} ({self.unwritten} bytes) of the script's "
                                 "output could not be written to output.log")
        if self.link is not None:
            self.link.flush()


def _grow(fd: int) -> None:
    """Make the pipe of ``fd`` PIPE_BYTES big where the system lets it."""
    try:
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    except (OSError, AttributeError):  # a smaller limit, or not Linux: 64 KB
        pass


def _unread(fd: int) -> int:
    """Bytes waiting in a pipe."""
    try:
        return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
    except OSError:
        return 0
