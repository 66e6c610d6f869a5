"""Marks in the script's output that say at which step its bytes were written.

The output relay (output.py) reads the pipe that fds 1 and 2 write to, and under a flood
it reads what was written several steps ago: the step in progress when it reads is not
the step a line was printed at. So the writing side puts small marks into the same pipe,
where the kernel orders them with the script's own bytes, and the relay takes them out
again (output.log and the terminal never see one) and keeps each line at the step its
marks say. Two kinds, each a single write of MARK_LEN bytes (atomic in a pipe: never split
by another writer's bytes):

- **F(s)**, before the first write through ``sys.stdout`` or ``sys.stderr`` at step ``s``
  (a thin wrapper of their ``write``): what follows was written at ``s``. Exact for the
  script's own prints, read at once, whatever the relay's delay.
- **T(s)**, at the step boundary where ``s`` begins (stepend.py, before the counter moves),
  only if something was printed or read in the step that ends (``StepState.out_dirty``):
  what came before was written at ``s - 1`` or earlier, what follows at ``s`` or later. It closes a step's bytes, so the
  bytes of writers the wrapper does not see (a DataLoader worker, C code, a script's own
  ``sys.stdout``), under a flood (the relay reading all the time, so a mark each step),
  are kept at their step too; when the relay keeps up, such bytes are at the step in
  progress when read, as before.

Nothing happens at a step when the script prints nothing: no write, no system call; the
wrapper costs a Python call per write. A mark waits for room in the pipe as the script's
own write would, where the script wrote in the step; a T mark for others' output only is
written without blocking (a full pipe skips it to the next boundary). The marks carry a random
prefix of this process's, so no output can be taken for one.

A third kind, **S(n)**, is the relay's own, written once fds 1 and 2 are output.log again
(``sync_mark``): the copier (outproc.py) answers it once everything before it is copied and read.
"""

from __future__ import annotations

import os
import struct
import sys

PREFIX_LEN = 16
MARK_LEN = PREFIX_LEN + 9
"""The prefix, the kind (F, T or S) and the step (S: a number), 8 bytes big-endian."""
_STEP = struct.Struct(">q")

_LIVE: list[Marks] = []
"""The marks of this process: a forked child writes none (its step counter is a copy)."""


def _forked() -> None:
    for marks in _LIVE:
        marks.on = False
    _LIVE.clear()


os.register_at_fork(after_in_child=_forked)


def sync_mark(prefix: bytes, n: int) -> bytes:
    """The S mark ``n``: the copier says when it has read this far."""
    return prefix + b"S" + _STEP.pack(n)


def new_prefix() -> bytes:
    """A prefix no output holds by chance: two bytes no text starts a line with, and random ones."""
    return b"\x00\x1b" + os.urandom(PREFIX_LEN - 2)


class Marks:
    """The writing side, in the training process: F marks from the wrapped streams, T marks
    from the step boundary (``state``: stepstate.StepState), into the pipe ``write_fd``."""

    def __init__(self, write_fd: int, state, prefix: bytes | None = None, streams=None) -> None:
        self.prefix = prefix or new_prefix()
        self._fd = os.dup(write_fd)
        """Blocking, as the script's own writes: an F mark waits as its write would."""
        # A description of its own (a dup would share the blocking flag with fds 1 and 2).
        self._nowait = os.open(f"/proc/self/fd/{write_fd}", os.O_WRONLY | os.O_NONBLOCK)
        self._state = state
        self._current = streams or _sys_streams
        """The streams to wrap, as they are now: sys.stdout and sys.stderr."""
        self._marked = -1
        """The step whose F mark was written last."""
        self._streams: list = []
        self._out = self._err = None
        """sys.stdout and sys.stderr as last seen: a script that replaces one has it wrapped too."""
        self.on = True
        _LIVE.append(self)
        state.out_mark = self.boundary
        self._streams_seen()

    def _streams_seen(self) -> None:
        """Wrap sys.stdout and sys.stderr where they are new: the first ones, or a stream of
        the script's own on fd 1 or 2 (``sys.stdout = open(1, "w", buffering=1)``)."""
        first = self._out is None
        self._out, self._err = self._current()
        for stream in (self._out, self._err):
            if stream is not None and not first:
                try:
                    if stream.fileno() not in (1, 2):  # a file of its own: nothing of it comes here
                        continue
                except (AttributeError, OSError, ValueError):
                    continue
            self._wrap(stream)

    def _wrap(self, stream) -> None:
        """Give ``stream`` (the script's sys.stdout or sys.stderr) a ``write`` that marks the
        first write of each step: an attribute of the object, so its type, identity and every
        other method stay python's, and whatever holds the object (print, logging, tqdm) uses it."""
        if stream is None or "write" in getattr(stream, "__dict__", {"write": None}):
            return
        real = stream.write
        state, marks = self._state, self

        def write(text):
            step = state.step
            if step != marks._marked and marks.on:
                marks.first(step)
            written = real(text)
            state.out_dirty = True
            return written

        write.__wrapped__ = real
        try:
            stream.write = write
        except (AttributeError, TypeError):
            return
        self._streams.append(stream)

    def first(self, step: int) -> None:
        """The F mark of ``step``: the script writes through its streams."""
        self._marked = step
        self._put(self._fd, b"F", step)

    def boundary(self, step: int) -> None:
        """Step ``step`` begins (the training thread, before the counter moves), and
        something was printed or read since the previous boundary: the T mark."""
        self._state.out_dirty = False
        if not self.on:
            return
        out, err = self._current()
        if out is not self._out or err is not self._err:
            self._streams_seen()
        if self._marked == step - 1:  # the script wrote this step: a full pipe waits its next write anyway
            self._put(self._fd, b"T", step)
            return
        try:
            self._put(self._nowait, b"T", step)
        except BlockingIOError:  # a full pipe of others' output (a worker's): the next boundary marks it
            self._state.out_dirty = True

    def _put(self, fd: int, kind: bytes, step: int) -> None:
        try:
            os.write(fd, self.prefix + kind + _STEP.pack(step))
        except BlockingIOError:
            raise
        except OSError:
            self.on = False

    def close(self) -> None:
        """No more marks: the streams' own ``write`` back, the boundary's hook off, and the
        two descriptors pointed at /dev/null (not closed: a thread of the script may be
        about to write a mark, and a number closed now may be another file's soon)."""
        self.on = False
        self._state.out_mark = _no_mark
        self._state.out_dirty = False
        for stream in self._streams:
            try:
                del stream.write
            except AttributeError:
                pass
        self._streams = []
        if self in _LIVE:
            _LIVE.remove(self)
        null = os.open(os.devnull, os.O_WRONLY)
        for fd in (self._fd, self._nowait):
            os.dup2(null, fd, inheritable=False)
        os.close(null)


def _sys_streams() -> tuple:
    return sys.stdout, sys.stderr


def _no_mark(step: int) -> None:
    """The boundary's hook while no marks are written."""


class Splitter:
    """The reading side, in the relay's copier: each read's bytes without the marks, in
    pieces, each with the step its bytes were written at. ``now()``: the step in progress
    (read after the bytes were, so an upper bound of their step)."""

    def __init__(self, prefix: bytes, now) -> None:
        self.prefix = prefix
        self._now = now
        self._step = 0
        """The newest mark's step: the bytes after it were written at it or later."""
        self._exact = False
        """Whether the newest mark is an F mark: the bytes after it were written at its step."""
        self.held = b""
        """The start of a mark the read cut off, put before the next read's bytes."""
        self.syncs: list[int] = []
        """The S marks read and not yet answered."""

    def split(self, data: bytes) -> list[tuple[int, bytes]]:
        """``data`` (a read of the pipe) as ``(step, bytes)`` pieces, in order, without marks."""
        now = self._now()
        if self.held:
            data, self.held = self.held + data, b""
        prefix = self.prefix
        at = data.find(prefix)
        if at < 0:
            data = self._hold(data)
            return [(self._run_step(now, None), data)] if data else []
        pieces = []
        start = 0
        while at >= 0:
            if len(data) - at < MARK_LEN:  # the rest of this mark is in the pipe still
                self.held = data[at:]
                data = data[:at]
                break
            kind = data[at + PREFIX_LEN:at + PREFIX_LEN + 1]
            step = _STEP.unpack_from(data, at + PREFIX_LEN + 1)[0]
            if kind == b"S":
                if at > start:
                    pieces.append((self._run_step(now, None), data[start:at]))
                self.syncs.append(step)
                start = at + MARK_LEN
                at = data.find(prefix, start)
                continue
            if at > start:
                pieces.append((self._run_step(now, step - 1 if kind == b"T" else step), data[start:at]))
            self._step, self._exact = step, kind == b"F"
            start = at + MARK_LEN
            at = data.find(prefix, start)
        rest = data[start:] if self.held else self._hold(data[start:])
        if rest:
            pieces.append((self._run_step(now, None), rest))
        return pieces

    def _run_step(self, now: int, upper: int | None) -> int:
        """The step of bytes after the newest mark: its own after an F mark; after a T mark,
        the step in progress when read, or the next mark's bound where it came with them."""
        if self._exact:
            return self._step
        bound = now if upper is None else min(now, upper)
        return max(self._step, bound)

    def _hold(self, data: bytes) -> bytes:
        """``data`` less a tail that may start a mark (its prefix cut off by the read)."""
        first = self.prefix[:1]
        at = data.find(first, max(0, len(data) - MARK_LEN + 1))
        while at >= 0:
            tail = data[at:]
            if self.prefix.startswith(tail[:PREFIX_LEN]) if len(tail) < PREFIX_LEN else tail.startswith(self.prefix):
                self.held = tail
                return data[:at]
            at = data.find(first, at + 1)
        return data

    def release(self) -> list[tuple[int, bytes]]:
        """What is held, as a piece: no mark came of it, so it is the script's own bytes."""
        held, self.held = self.held, b""
        return [(self._run_step(self._now(), None), held)] if held else []
