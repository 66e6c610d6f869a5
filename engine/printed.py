"""Metrics the script only prints, made series: found where the output is already read
(printread.py: in the output relay's copier, outproc.py, never on the training thread),
kept here, in the engine, at the optimizer step each line was written at; under DDP every
rank has its own relay and its own steps.

- **Names**: a value becomes ``printed/<name>`` (shared/names.py); a name the script also
  gives ``ptdash.log`` is left out (the explicit value wins); the first value of each name
  is an event (``found printed metric val_loss = 2.29 at step 200: ...``), so a wrong guess
  is seen, with the line it came from. At most MAX_NAMES names.
- **Twins**: a training loss the script prints that is ptdash's own ``loss`` is not kept twice (``drain``).

The flusher takes what was found (``drain``) and writes it with the steps' own rows (``merge``).
"""

from __future__ import annotations

import bisect
import decimal
import re
import threading
import time
from typing import Callable, Iterable

from .printread import PrintReader
from .shared import events, names

MAX_NAMES = 200
"""Printed names kept as series; more are left out (and said, once)."""
JUDGED_DIGITS = 3
"""Significant digits a printed loss needs to be judged the same as ptdash's (``drain``)."""


class PrintedMetrics:
    """See the module docstring. ``step()``: the step in progress; ``event(what, message)``:
    the journal's; ``logged``: the names given to ``ptdash.log`` so far (a live set)."""

    def __init__(self, step: Callable[[], int], event: Callable[..., object], logged: set[str] | frozenset = frozenset()) -> None:
        self._step, self._event, self._logged = step, event, logged
        self.reader = PrintReader(step, self.take)
        """The stream's reading, where the output is read in this process (output.py's thread, outtap.py)."""
        self._seen: set[str] = set()
        self._shadowed: set[str] = set()
        self._full = False
        self._lock = threading.Lock()
        self._pending: dict[int, dict[str, float | None]] = {}
        self._twins: dict[str, bool] = {}
        """A series' verdict: whether it is ptdash's own loss, printed (``drain``)."""
        self.found = 0
        """Values found so far."""

    # ------------------------------------------------------------- the relay's side

    def feed(self, data: bytes) -> None:
        """A chunk of the script's output, as the relay read it (printread.py)."""
        self.reader.feed(data)

    def now(self) -> int:
        """The step in progress: what output read without a mark of its step is kept at."""
        return self._step()

    def feed_pieces(self, pieces: list[tuple[int, bytes]]) -> None:
        """Pieces of output, each with the step it was written at (printread.py)."""
        self.reader.feed_pieces(pieces)

    def finish(self) -> None:
        """The output ended: its unfinished line counts as it stands."""
        self.reader.finish()

    def take(self, found: list[tuple[str, float | None]], step: int, line: str) -> None:
        """A line's metrics (printread.py's, or the copier's), kept at ``step``."""
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


def _show(value: float | None) -> str:
    return "non-finite" if value is None else f"{value:.6g}"
