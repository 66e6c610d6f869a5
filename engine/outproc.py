"""The output relay's copier: what reads the script's pipe, writes output.log, and reads
the output for the metrics it prints, in a process of its own.

output.py points fds 1 and 2 at a pipe and starts this (``python -m ptdash.outproc``)
on its read end. A thread of the training process did it before, and each read, parse and
write took the GIL from the training thread: a script printing 20 MB/s ran at 0.83 of the
same run with the parsing off (benchmarks/printed_output.py). Here the script pays for its
writes alone, as it would into ``| tee``. The copier:

- takes the step marks out (outmarks.Splitter) and writes the rest to output.log, held at
  most BATCH_S (or BATCH_BYTES) so that a flood is read in batches;
- reads those bytes for metrics (printread.PrintReader), each line at the step its marks say;
- tells the engine, on a pipe of frames (a kind byte, a length, a body; ``read_frames``):
  ``V`` a line's metrics ``[step or null, [[name, value], ...], line]`` (null: no mark
  said, so the step in progress when the engine reads it), ``D`` bytes were read since the
  last step boundary (``StepState.out_dirty``: the next boundary marks where they end; at
  most one each DIRTY_S), ``O`` bytes output.log could not take (for the headless front),
  ``N`` a notice ``[full | say | room, text]`` (diskspace.NOTICE), ``S`` the engine's sync
  mark ``n`` came: what was written before it is copied and read; ``E`` the pipe's end
  (no writer left): it exits.

It lives until the pipe's last writer is gone (a persistent DataLoader worker may outlive
the engine) and ignores SIGINT, SIGTERM and SIGHUP in a session of its own: the signal
that stops a job must not lose what it printed last (tui/hardstop.py leaves it to copy
to the end). Should it die, the engine copies on a thread (output.py). ``Copier`` is also
that thread's. Stdlib and ptdash's pure modules only: no torch.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import signal
import struct
import sys
import termios
import time

from .outmarks import Splitter
from .printread import PrintReader

BATCH_S = 0.1
"""Longest the output is held for the parser before output.log gets it."""
BATCH_BYTES = 1 << 18
"""Most output held for the parser at once."""
READ_BYTES = 1 << 16
"""Most bytes a read takes: a flood comes in reads of this, one batch for the parser each
few (BATCH_BYTES), so that a line printed every few dozen steps is never a frequent one
there (printread.FREQUENT)."""
NAP_S = 0.005
"""After a read that found the pipe far from full, how long the copier waits before the
next: a script printing at every step would otherwise wake it at every write."""
DIRTY_S = 0.005
"""Most often a ``D`` frame is sent: the engine needs one before its next step boundary."""
NOW = 1 << 62
"""The step of bytes no mark placed: the engine's step in progress (a frame's null)."""
_HEAD = struct.Struct(">cI")


class Copier:
    """Copies ``read_fd`` to ``log_fd`` until end of file; see the module docstring.
    ``sinks`` get what is found and said (``FrameSink`` here; output.py's own on its
    thread); ``now()``: the step in progress, NOW where it is not known here."""

    def __init__(self, read_fd: int, log_fd: int, prefix: bytes, sinks, parse: bool = True,
                 now=lambda: NOW) -> None:
        self._read, self._log, self._sinks = read_fd, log_fd, sinks
        self._split = Splitter(prefix, now)
        self._reader = PrintReader(now, sinks.take) if parse else None
        self._held: list[tuple[int, bytes]] = []
        self._size = 0
        self._due = self._last = 0.0
        """When the held output is due to the parser; when it last got some."""
        self._dirty_due: float | None = None
        """When the ``D`` held back (DIRTY_S) is due."""
        self._dirty_at = 0.0
        self._failing = False
        self.unwritten = 0
        """Bytes of output that output.log could not take."""

    def run(self) -> None:
        os.set_blocking(self._read, False)
        while True:
            due = [t for t in (self._due if self._held else None, self._dirty_due) if t is not None]
            timeout = max(0.0, min(due) - time.monotonic()) if due else None
            try:
                ready = select.select([self._read], [], [], timeout)[0]
            except InterruptedError:
                continue
            except (OSError, ValueError):
                break
            if self._dirty_due is not None and time.monotonic() >= self._dirty_due:
                self._dirty()
            if not ready:
                self._release()
                continue
            try:
                data = os.read(self._read, READ_BYTES)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                break
            if not data:
                break
            self._take(data)
            if len(data) < READ_BYTES >> 2:
                time.sleep(NAP_S)
        self._held += self._split.release()
        self._end()
        self._sinks.ended()

    def _take(self, data: bytes) -> None:
        split = self._split
        pieces = split.split(data)
        if split.held and not unread(self._read):  # a mark's rest would be in the pipe: the script's bytes
            pieces += split.release()
        if pieces:
            self._dirty()
            if self._reader is None:
                self._write(b"".join(piece for _, piece in pieces))
            else:
                if not self._held:  # output after a quiet while is read at once, a flood in batches
                    self._due = self._last + BATCH_S
                self._held += pieces
                self._size += len(data)
                if self._size >= BATCH_BYTES or time.monotonic() >= self._due:
                    self._release()
        if split.syncs:
            self._end()
            for n in split.syncs:
                self._sinks.synced(n)
            split.syncs.clear()

    def _dirty(self) -> None:
        now = time.monotonic()
        if now - self._dirty_at >= DIRTY_S:
            self._dirty_at, self._dirty_due = now, None
            self._sinks.dirty()
        else:
            self._dirty_due = self._dirty_at + DIRTY_S

    def _release(self) -> None:
        """The output held for the parser: read for metrics, then written to output.log."""
        if not self._held:
            return
        held, self._held, self._size, self._last = self._held, [], 0, time.monotonic()
        if self._reader is not None:
            self._reader.feed_pieces(held)  # never raises: the output goes on whatever a line holds
        self._write(b"".join(piece for _, piece in held))

    def _end(self) -> None:
        """All read so far copied and read; an unfinished last line counts as it stands."""
        self._release()
        if self._reader is not None:
            self._reader.finish()

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self._log, view):]
        except OSError as exc:
            rest = bytes(view)
            self.unwritten += len(rest)
            self._sinks.unwritten_bytes(rest)
            if not self._failing:
                self._failing = True
                full = getattr(exc, "errno", None) in _FULL
                what = ("output.log cannot be written" if full else f"output.log cannot be written ({exc})")
                self._sinks.notice("full" if full else "say", what + ": the script's output still streams to "
                                   "the front, and what is not written is counted")
            return
        if self._failing:
            self._failing = False
            self._sinks.notice("room", f"output.log is written again; {self.unwritten} bytes of the script's "
                                       "output could not be written to it")


_FULL = frozenset({28, 122})  # ENOSPC, EDQUOT (shared/diskspace.py's, without its imports)


class FrameSink:
    """The copier's side of the frames to the engine (``fd``); once the engine is gone, none."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def _send(self, kind: bytes, body: bytes = b"") -> None:
        if self._fd < 0:
            return
        view = memoryview(_HEAD.pack(kind, len(body)) + body)
        try:
            while view:
                view = view[os.write(self._fd, view):]
        except OSError:  # the engine ended (or was killed): the copying goes on without it
            self._fd = -1

    def take(self, found: list, step: int, line: str) -> None:
        self._send(b"V", json.dumps([None if step >= NOW else step, found, line]).encode())

    def dirty(self) -> None:
        self._send(b"D")

    def unwritten_bytes(self, data: bytes) -> None:
        self._send(b"O", data)

    def notice(self, kind: str, text: str) -> None:
        self._send(b"N", json.dumps([kind, text]).encode())

    def synced(self, n: int) -> None:
        self._send(b"S", str(n).encode())

    def ended(self) -> None:
        self._send(b"E")


def read_frames(fd: int):
    """The frames on ``fd`` as ``(kind, body)``, until its end (the copier ended)."""
    buf = b""
    while True:
        try:
            data = os.read(fd, 1 << 16)
        except InterruptedError:
            continue
        except OSError:
            return
        if not data:
            return
        buf += data
        while len(buf) >= _HEAD.size:
            kind, size = _HEAD.unpack_from(buf)
            if len(buf) < _HEAD.size + size:
                break
            yield kind, buf[_HEAD.size:_HEAD.size + size]
            buf = buf[_HEAD.size + size:]


def unread(fd: int) -> int:
    """Bytes waiting in a pipe."""
    try:
        return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
    except OSError:
        return 0


def main(argv: list[str]) -> int:
    """``python -m ptdash.outproc READ_FD LOG_FD BACK_FD PREFIX_HEX PARSE``."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    read_fd, log_fd, back_fd = (int(a) for a in argv[:3])
    Copier(read_fd, log_fd, bytes.fromhex(argv[3]), FrameSink(back_fd), parse=argv[4] == "1").run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
