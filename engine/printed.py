"""Metrics the script only prints, made series: read where the output relay already reads
the pipe (output.py's thread), never on the training thread.

``PrintedMetrics.feed`` takes each chunk the relay copied to output.log. A chunk's lines
are kept at the optimizer step in progress when it was read (``step()``: the engine's
counter, read without a lock); under DDP every rank has its own relay and its own steps.
What a line says is printparse.py's; here, the stream:

- **Carriage returns**: a line redrawn in place (a tqdm or Lightning bar) counts by its
  final state, the last drawing that is not blank (a bar that clears itself leaves its
  last state); a bar that starts again (its percentage falls: Lightning's next epoch on
  the same line) counts the drawing before, as it ended.
- **Cost**: a chunk's lines are grouped by shape (the line without its digits); only the
  last line of each shape is read, and a shape that never held a metric is not read again.
  A script that prints the same line a million times costs a split and a dict of a chunk,
  in C, and one parse.
- **Names**: a value becomes ``printed/<name>`` (shared/names.py); a name the script also
  gives ``ptdash.log`` is left out (the explicit value wins); the first value of each name
  is an event (``found printed metric val_loss = 2.29 at step 200: ...``), so a wrong guess
  is seen, with the line it came from. At most MAX_NAMES names.

The flusher takes what was found (``drain``) and writes it with the steps' own rows (``merge``).
"""

from __future__ import annotations

import bisect
import collections
import decimal
import logging
import re
import threading
import time
from typing import Callable, Iterable

from . import printparse
from .shared import events, names

log = logging.getLogger("ptdash.printed")

MAX_NAMES = 200
"""Printed names kept as series; more are left out (and said, once)."""
MAX_TAIL = 1 << 16
"""Bytes of an unfinished line kept; a longer one is not read."""
JUDGED_DIGITS = 3
"""Significant digits a printed loss needs to be judged the same as ptdash's (``drain``)."""
SHAPES = 4096
"""Shapes of lines remembered as holding no metric (forgotten all at once when full)."""

FREQUENT = 4
"""Lines of one shape in a batch (``feed_pieces``) above which only the newest is read."""

_DIGITS = b"0123456789"
_PROGRESS = re.compile(rb"(\d{1,3})%\|")
_CONTEXT = (b'File "', b"Warning: ")
"""What a line of source code follows: with one of these in a chunk, it is read line by line."""


class PrintedMetrics:
    """See the module docstring. ``step()``: the step in progress; ``event(what, message)``:
    the journal's; ``logged``: the names given to ``ptdash.log`` so far (a live set)."""

    def __init__(self, step: Callable[[], int], event: Callable[..., object], logged: set[str] | frozenset = frozenset()) -> None:
        self._step, self._event, self._logged = step, event, logged
        self._tail = b""
        """The line under way since the last newline: its segment after the last carriage return."""
        self._drawn = b""
        """The line's last finished drawing that is not blank (a carriage return ended it)."""
        self._overlong = False
        self._silent: set[bytes] = set()
        """Shapes of lines that held no metric."""
        self._seen: set[str] = set()
        self._shadowed: set[str] = set()
        self._full = False
        self._lock = threading.Lock()
        self._pending: dict[int, dict[str, float | None]] = {}
        self._twins: dict[str, bool] = {}
        """A series' verdict: whether it is ptdash's own loss, printed (``drain``)."""
        self.found = 0
        """Values found so far."""

    # ------------------------------------------------------------- the relay's thread

    def feed(self, data: bytes) -> None:
        """A chunk of the script's output, as the relay read it."""
        try:
            reads: list = []
            self._feed(data, self._step(), reads)
            self._read(reads)
        except Exception:  # noqa: BLE001 - the output must go on whatever a line does here
            log.exception("reading the script's output for metrics failed")

    def now(self) -> int:
        """The step in progress, for ``feed_pieces``: what a piece of output is kept at."""
        return self._step()

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

    def _take(self, found: list[tuple[str, float | None]], step: int, line: str) -> None:
        values = {}
        for name, value in found:
            if name in self._logged:
                if name not in self._shadowed:
                    self._shadowed.add(name)
                    self._event(events.PrintedMetric(name=name, left_out="logged"),
                                f"printed metric {name} is left out: ptdash.log gives {names.user(name)}")
                continue
            if name not in self._seen:
                if len(self._seen) >= MAX_NAMES:
                    if not self._full:
                        self._full = True
                        self._event(events.PrintedMetric(name=name, left_out="too many"),
                                    f"more than {MAX_NAMES} printed metrics: {name} and later new names are left out")
                    continue
                self._seen.add(name)
                self._event(events.PrintedMetric(name=name, series=names.printed(name), value=value,
                                                 line=line.strip()[:200]),
                            f"found printed metric {name} = {_show(value)} at step {step}: {line.strip()[:120]}",
                            step=step)
            values[names.printed(name)] = value
        if values:
            self.found += len(values)
            with self._lock:
                self._pending.setdefault(step, {}).update(values)

    # ------------------------------------------------------------- the flusher's thread

    def drain(self, rows: list = (), earlier: list = ()) -> list[tuple[int, dict[str, float | None]]]:
        """What was found since the previous drain: ``(step, {series: value})``, by step,
        less the training loss ptdash records itself (``rows``, ``earlier``: this flush's
        and the previous one's rows, whose ``loss`` it is compared with; ``twin``)."""
        with self._lock:
            pending, self._pending = self._pending, {}
        found = sorted(pending.items())
        if any(self._twins.get(series) is not False for _, values in found for series in values):
            losses = {row[0]: row[2].get(names.LOSS) for part in (earlier, rows) for row in part}
            found = [(step, self._twin(step, values, losses)) for step, values in found]
        return [(step, values) for step, values in found if values]

    def _twin(self, step: int, values: dict, losses: dict) -> dict:
        """``values`` less a training loss the script printed that is ptdash's own ``loss``
        (a line like ``step 10 | loss 2.2921``, or a last ``final train loss``): the same
        value, to the digits printed, at the same step. Judged once for each name, at its
        first value of JUDGED_DIGITS digits or more with a recorded loss beside it; one that
        differs (a mean over the last steps, another loss) is kept as its own, and so is a
        value before the judging."""
        out = {}
        for series, value in values.items():
            same = self._twins.get(series)
            if same is None and twin_candidate(names.parse_printed(series) or ""):
                loss = losses.get(step)
                if loss is not None and value is not None:
                    same = _same_printed(value, loss)
                    if same is not None:
                        self._twins[series] = same
                    if same:
                        name = names.parse_printed(series)
                        self._event(events.PrintedMetric(name=name, left_out="ptdash's loss"),
                                    f"printed metric {name} is the loss ptdash records ({names.LOSS}: {_show(loss)} "
                                    f"at step {step}): not kept twice", step=step)
            elif same is None:
                self._twins[series] = False
            if not same:
                out[series] = value
        return out


def merge(rows: list, found: Iterable[tuple[int, dict]], earlier: list) -> list:
    """``rows`` (a flush's ``[step, wall, {name: value}]``, by step) with the printed values
    ``found`` in the rows of their steps. A step with no row here gets a row of its own, with
    its wall time from ``earlier`` (the previous flush's rows), so the store's step times stay
    the steps' own; failing that (a step before the first, or long gone), the time now."""
    found = list(found)
    if not found:
        return rows
    at = {row[0]: row for row in rows}
    extra = []
    for step, values in found:
        row = at.get(step)
        if row is not None:
            row[2].update(values)
            continue
        i = bisect.bisect_left(earlier, step, key=_step) if earlier else 0
        wall = earlier[i][1] if i < len(earlier) and earlier[i][0] == step else time.time()
        extra.append([step, wall, dict(values)])
    if not extra:
        return rows
    return sorted(rows + extra, key=_step)


def twin_candidate(name: str) -> bool:
    """Whether a printed name may be the training loss ptdash records: a loss of no held-out
    split (``loss``, ``train_loss``, ``final_train_loss``; not ``val_loss``)."""
    words = [w for w in re.split(r"[_ ./-]+", name) if w]
    return names.LOSS in words and not any(w in names.HELD_OUT for w in words)


def _same_printed(printed: float, value: float) -> bool | None:
    """Whether ``printed`` is ``value`` as printed: within half a unit of its last digit;
    None where it says too little to tell (fewer than JUDGED_DIGITS significant digits:
    ``1.0000`` reads as 1.0, and 1/step printed at step 1 is within 0.05 of most losses)."""
    digits = decimal.Decimal(repr(printed)).as_tuple()
    if not isinstance(digits.exponent, int) or len(digits.digits) < JUDGED_DIGITS:
        return None
    return abs(printed - value) <= 0.5 * 10.0 ** digits.exponent * (1 + 1e-9) + 1e-12


def _step(row: list) -> int:
    return row[0]


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


def _show(value: float | None) -> str:
    return "non-finite" if value is None else f"{value:.6g}"
