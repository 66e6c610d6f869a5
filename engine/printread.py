"""The script's output read as a stream, its lines to printparse.py, what they hold to ``take``.

Read where the output is already read (outproc.py's copier, a process of its own; output.py's
thread where that cannot run; outtap.py for a launcher's fds), never on the training thread.
Each chunk's lines are kept at the step they were written at (the pieces' steps, from the
output's marks, outmarks.py) or, without marks, at the step in progress when read.

- **Carriage returns**: a line redrawn in place (a tqdm or Lightning bar) counts by its
  final state, the last drawing that is not blank (a bar that clears itself leaves its
  last state); a bar that starts again (its percentage falls: Lightning's next epoch on
  the same line) counts the drawing before, as it ended.
- **Cost**: a chunk's lines are grouped by shape (the line without its digits); only the
  last line of each shape is read, and a shape that never held a metric is not read again.
  A script that prints the same line a million times costs a split and a dict of a chunk,
  in C, and one parse.

What is found goes to ``take(found, step, line)``: printed.PrintedMetrics in the engine, or
the copier's frames to it.
"""

from __future__ import annotations

import collections
import logging
import re
from typing import Callable

from . import printparse

log = logging.getLogger("ptdash.printed")

MAX_TAIL = 1 << 16
"""Bytes of an unfinished line kept; a longer one is not read."""
SHAPES = 4096
"""Shapes of lines remembered as holding no metric (forgotten all at once when full)."""
FREQUENT = 4
"""Lines of one shape in a batch (``feed_pieces``) above which only the newest is read."""

_DIGITS = b"0123456789"
_PROGRESS = re.compile(rb"(\d{1,3})%\|")
_CONTEXT = (b'File "', b"Warning: ")
"""What a line of source code follows: with one of these in a chunk, it is read line by line."""

Take = Callable[[list, int, str], None]
"""``take(found, step, line)``: a line's ``(name, value)`` pairs, its step and its text."""


class PrintReader:
    """See the module docstring. ``step()``: the step in progress, for ``feed``."""

    def __init__(self, step: Callable[[], int], take: Take) -> None:
        self._step, self._take = step, take
        self._tail = b""
        """The line under way since the last newline: its segment after the last carriage return."""
        self._drawn = b""
        """The line's last finished drawing that is not blank (a carriage return ended it)."""
        self._overlong = False
        self._silent: set[bytes] = set()
        """Shapes of lines that held no metric."""

    def feed(self, data: bytes) -> None:
        """A chunk of the script's output, as the relay read it."""
        try:
            reads: list = []
            self._feed(data, self._step(), reads)
            self._read(reads)
        except Exception:  # noqa: BLE001 - the output must go on whatever a line does here
            log.exception("reading the script's output for metrics failed")

    def feed_pieces(self, pieces: list[tuple[int, bytes]]) -> None:
        """Pieces of output, each with the step it was read at (``now()`` then), read at
        once: what the relay held while the output came fast. A report printed at more
        than FREQUENT of the steps here is read for its newest line only (a bar or a loss
        line printed at every step, thinned to one value a batch); any other line is kept
        at its own step."""
        try:
            reads: list = []
            for step, data in pieces:
                self._feed(data, step, reads)
            self._read(reads)
        except Exception:  # noqa: BLE001 - the output must go on whatever a line does here
            log.exception("reading the script's output for metrics failed")

    def finish(self) -> None:
        """The output ended: its unfinished line counts as it stands."""
        if self._tail or self._drawn:
            self.feed(b"\n")

    def _feed(self, data: bytes, step: int, reads: list) -> None:
        """The stream's state on from ``data``; its finished lines go to ``reads`` with ``step``."""
        text = self._tail + data if self._tail else data
        newline = text.rfind(b"\n")
        if newline >= 0:
            lines = text[:newline].split(b"\n")
            if self._overlong:
                lines[0], self._overlong = b"", False
            if self._drawn or b"\r" in text[:newline]:
                lines = self._final_states(lines, _redrawn(text[:newline]))
            reads.append((lines, step))
            text = text[newline + 1:]
        if b"\r" in text:
            segments = text.split(b"\r")
            reads.append((self._restarted(segments), step))
            text = segments[-1]
        if len(text) > MAX_TAIL:
            text, self._overlong = b"", True
        self._tail = text

    def _final_states(self, lines: list[bytes], redrawn: list[int]) -> list[bytes]:
        """Each line as it ended (the first goes on from the drawing before this chunk).
        Only the ``redrawn`` lines (their indices) are looked at one by one; the others are
        copied in slices: a chunk of a thousand lines with a bar in it costs a few."""
        if self._drawn and redrawn[:1] != [0]:
            redrawn.insert(0, 0)
        out: list[bytes] = []
        start = 0
        for i in redrawn:
            out += lines[start:i]
            start = i + 1
            segments = lines[i].split(b"\r")
            out += self._restarted(segments)
            last = segments[-1] if segments[-1].strip() else self._drawn
            if last:
                out.append(last)
            self._drawn = b""
        out += lines[start:]
        return out

    def _restarted(self, segments: list[bytes]) -> list[bytes]:
        """The drawings among ``segments`` (all but the last finished by a carriage return)
        that ended: one the line was cleared after, or one a bar started again after (its
        percentage fell). The last drawing not counted yet stays in ``_drawn``."""
        out = []
        previous = self._drawn
        for segment in segments[:-1]:
            if not segment.strip():
                if previous:  # cleared: it ended as it was drawn last
                    out.append(previous)
                    previous = b""
                continue
            if previous and _restart(previous, segment):
                out.append(previous)
            previous = segment
        if previous and segments[-1].strip() and _restart(previous, segments[-1]):
            out.append(previous)
            previous = b""
        self._drawn = previous
        return out

    def _read(self, reads: list[tuple[list[bytes], int]]) -> None:
        """The lines of ``reads`` (each list with its step)."""
        if len(reads) == 1:
            lines, step = reads[0]
            steps = None
        else:
            lines = [line for part, _ in reads for line in part]
            steps = [step for part, step in reads for _ in part]
            step = steps[-1] if steps else 0
        if not lines:
            return
        blob = b"\n".join(lines)
        if any(marker in blob for marker in _CONTEXT):
            previous = ""
            for i, line in enumerate(lines):
                text = printparse.clean(line.decode("utf-8", "replace"))
                if not printparse.skipped(text, previous):
                    self._take(printparse.parse(text), steps[i] if steps else step, text)
                previous = text
            return
        # Only the last line of each shape: the same report printed again says nothing new
        # within one read, all of whose lines are kept at one step. Over several reads (a
        # batch), a shape seen at no more than FREQUENT lines keeps each, at its step.
        shapes = blob.translate(None, _DIGITS).split(b"\n")
        last = dict(zip(shapes, range(len(lines))))
        picked = sorted(last.values())
        if steps is not None and len(last) < len(lines):
            counts = collections.Counter(shapes)
            rare = {shape for shape, n in counts.items() if 1 < n <= FREQUENT and shape not in self._silent}
            if rare:
                picked = sorted(set(picked).union(i for i, shape in enumerate(shapes) if shape in rare))
        silent = self._silent
        for i in picked:
            shape = shapes[i]
            if shape in silent:
                continue
            text = printparse.clean(lines[i].decode("utf-8", "replace"))
            found = [] if printparse.skipped(text) else printparse.parse(text)
            if found:
                self._take(found, steps[i] if steps else step, text)
            else:
                if len(silent) >= SHAPES:
                    silent.clear()
                silent.add(shape)


def _redrawn(text: bytes) -> list[int]:
    """The indices of the lines of ``text`` that hold a carriage return, found in one pass in C."""
    out: list[int] = []
    line = last = 0
    pos = text.find(b"\r")
    while pos >= 0:
        line += text.count(b"\n", last, pos)
        if not out or out[-1] != line:
            out.append(line)
        last = pos
        pos = text.find(b"\r", pos + 1)
    return out


def _restart(before: bytes, after: bytes) -> bool:
    """Whether a bar drawn as ``after`` started again since ``before``: its percentage fell."""
    old, new = _PROGRESS.search(before), _PROGRESS.search(after)
    return old is not None and new is not None and int(new.group(1)) < int(old.group(1))
