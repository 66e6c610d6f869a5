"""The LR schedule ahead of the main optimizer, kept true for the dashboards: ``SchedulePreview``.

The flusher calls ``observe(rows)`` once per flush, on its thread. It reads the main
optimizer's scheduler (never writes to it), copies it (schedule.twin) when there is no
current preview, and hands the copy to a thread of its own that steps it to the end of
the run (schedule.advance): a long schedule costs a fraction of a second there, never on
the training thread nor in a flush. Each flush then checks the preview against what
happened: the scheduler's own step count and LRs, and the LRs the step records carry. A
preview that stops matching (a schedule set by hand, ``last_epoch`` changed, a scheduler
loaded from a file) is simulated again from the scheduler's state; one that fails again
and again means the script sets its LR by hand, and the dashboard is told so.

A scheduler may step once per optimizer step or once per epoch: the optimizer steps per
scheduler step are measured from when its counter moves, and the preview is placed on
the optimizer-step axis with them.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable

from . import schedule
from .shared.names import MAIN_LR_PREFIX
from .shared.protocol import Schedule

log = logging.getLogger("ptdash.preview")

AHEAD_STEPS = 4096
"""Optimizer steps previewed when nothing says where the run or its schedule ends."""

MAX_AHEAD = 100_000
"""Scheduler steps simulated at most (about half a second on the preview's thread)."""

POINTS = 480
"""Points a Schedule message carries at most per group (fewer with many groups)."""

FAILURES = 3
"""Previews in a row that fail at once before the LR counts as set by hand."""

BY_HAND = "set by hand"
"""The note of a schedule the script sets itself (no scheduler, or not the scheduler's values)."""

_LR = MAIN_LR_PREFIX
"""The main optimizer's per-group LRs in a step row: ``opt/lr/group<i>``."""
_LR_NAMES = tuple(f"{_LR}{i}" for i in range(64))
"""The first param groups' LR names, looked up by name (a row's values are not scanned for them;
a row with all of them is, for the groups after)."""

_CHUNK = 2048
"""Scheduler steps simulated between two yields of the GIL to the training thread."""


@dataclass
class _Preview:
    """One simulation: the scheduler's LRs from its step ``base`` on, and where it sits."""

    base: int
    """The scheduler's step count when it was copied; ``lrs[i]`` is its LRs at ``base + i``."""
    lrs: list
    ended: bool
    """Whether the copy reached the scheduler's end (it refused another step)."""
    step: int
    """The newest optimizer step when it was copied."""
    first_step: int
    """The optimizer step that uses ``lrs[0]``."""
    end: int | None
    """The scheduler's own end (schedule.natural_end), in its steps."""
    generation: int
    """Which scheduler it is of (a preview of one no longer followed is dropped)."""
    verified: bool = False


class SchedulePreview:
    """Keeps the main optimizer's schedule ahead; the flusher sends what ``observe`` returns.

    ``main()`` is the main optimizer (or None), ``step()`` the optimizer steps done so far
    (the training thread's count, read as the scheduler is), ``lr_scale()`` the live LR
    factor, ``run_end()`` the optimizer step the run is known to end at (or None);
    ``on_end(step)`` is told where a schedule ends, for the run's total.
    """

    def __init__(self, discovery, main: Callable[[], Any], step: Callable[[], int], lr_scale: Callable[[], float],
                 run_end: Callable[[], int | None], on_end: Callable[[int], None] = lambda step: None) -> None:
        self._discovery, self._main, self._steps, self._lr_scale, self._run_end, self._on_end = (
            discovery, main, step, lr_scale, run_end, on_end)
        self.latest: Schedule | None = None
        """The newest message (sent to a dashboard that connects later)."""
        self._followed: weakref.ref | None = None
        self._reason: str | None = None
        self._preview: _Preview | None = None
        self._failures = 0
        self._unexplained = 0
        self._generation = 0
        self._pending = False
        self._scale: float | None = None
        self._row_lrs: list | None = None
        self._lr_moved_at = 0
        self._recorded: list | None = None
        self._step = 0
        self._changes: list[tuple[int, int]] = []
        """(optimizer step, scheduler count) where the scheduler's count was seen to move."""
        self._seen_count: int | None = None
        self._ratio: float | None = None
        self._offset: int | None = None
        """The scheduler's count less the optimizer's steps, between two steps (once a step)."""
        self._lock = threading.Lock()
        self._job: tuple | None = None
        self._done: _Preview | None = None
        self._wake = threading.Event()
        self._idle = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---------------------------------------------------------------- flusher thread

    def observe(self, rows: list) -> list[Schedule]:
        """Take a flush's step rows; return the Schedule messages to store and send (often none)."""
        recorded = self._newest_lrs(rows)
        opt = self._main()
        if opt is None:
            return []
        scheds = [s for s in self._discovery.top_schedulers() if getattr(s, "optimizer", None) is opt]
        if not scheds:
            previous, self._recorded = self._recorded, recorded or self._recorded
            if recorded and previous and not _close(recorded, previous):
                return self._note(BY_HAND)
            return []
        if len(scheds) > 1:
            return self._note("several schedulers")
        sched = scheds[0]
        if self._followed is None or self._followed() is not sched:
            self._follow(sched)
        if self._reason is not None:
            return self._note(self._reason)
        if self.latest is not None and self.latest.note:
            return []  # said once for this scheduler: the LR is not its doing
        # Read together: the training thread steps the scheduler meanwhile.
        now, count, last = self._steps(), schedule.counter(sched), schedule.last_lrs(sched)
        moved = self._count_moved(count, now)
        previous, self._recorded = self._recorded, recorded or self._recorded
        # An LR that changes while the scheduler's count stands still is set by something else.
        if not moved and recorded and previous and not _close(recorded, previous):
            self._unexplained += 1
            if self._unexplained >= FAILURES:
                return self._note(BY_HAND)
        elif recorded:
            self._unexplained = 0
        out = []
        with self._lock:
            done, self._done = self._done, None
        if done is not None and done.generation == self._generation:
            self._pending = False
            if not done.lrs:
                self._reason = "simulation failed"
                return self._note(self._reason)
            self._preview = done
            out += self._message(done)
        preview = self._preview
        if preview is not None:
            verdict = self._matches(preview, count, last, recorded)
            if verdict is False:
                self._failures = 1 if preview.verified else self._failures + 1
                self._preview = None
                if self._failures >= FAILURES:
                    return out + self._note(BY_HAND)
            elif verdict:
                preview.verified = True
                self._failures = 0
        if self._preview is None and not self._pending and self._ratio is not None:
            self._request(sched)
        return out

    def _newest_lrs(self, rows: list) -> list | None:
        """The newest row's unscaled LRs, or None when a factor change makes them incomparable.

        Notes the newest step whose LRs differ from the step before (where a scheduler that
        steps once an epoch took effect).
        """
        scale = self._lr_scale()
        changed, self._scale = self._scale is not None and scale != self._scale, scale
        newest = None
        for step, _, values in rows:
            lrs = []
            for name in _LR_NAMES:  # the row's groups are numbered from 0, without gaps
                if name not in values:
                    break
                lrs.append(values[name])
            else:
                lrs = [v for _, v in sorted((int(k[len(_LR):]), v) for k, v in values.items() if k.startswith(_LR))]
            if not lrs:
                continue
            self._step = max(self._step, step)
            newest = None if changed or None in lrs else [v / scale for v in lrs]
            if newest is not None and self._row_lrs is not None and newest != self._row_lrs \
                    and not _close(newest, self._row_lrs):
                self._lr_moved_at = step
            self._row_lrs = newest
        return newest

    def _follow(self, sched) -> None:
        self._followed = weakref.ref(sched)
        self._reason = schedule.why_not(sched)
        self._preview, self._failures, self._unexplained = None, 0, 0
        self._changes, self._seen_count, self._ratio, self._offset = [], None, None, None
        self._generation += 1  # a preview of the old scheduler still being computed is dropped
        self._pending = False
        if self.latest is not None and self.latest.note:
            self.latest = None  # a new scheduler: what was said of the old one no longer holds

    def _count_moved(self, count: int, now: int) -> bool:
        """Whether the scheduler's count moved since the last flush; measures optimizer steps
        per scheduler step from where it moved, and how the count sits against the steps."""
        moved = self._seen_count is not None and count != self._seen_count
        if moved:
            self._changes = (self._changes + [(now, count)])[-2:]
        self._seen_count = count
        # Read between an optimizer step and its scheduler step, the count is one short:
        # the largest difference seen is the one between steps.
        self._offset = count - now if self._offset is None else max(self._offset, count - now)
        if not self._changes:
            return moved
        (n0, e0), (n1, e1) = self._changes if len(self._changes) == 2 else ((0, 0), self._changes[0])
        if e1 <= e0 or n1 <= n0:
            return moved
        ratio = (n1 - n0) / (e1 - e0)
        # Seen at flushes, the step and the count are each off by up to one: a ratio that
        # close to a whole number is that number.
        whole = round(ratio)
        self._ratio = float(whole) if whole >= 1 and abs(ratio - whole) <= (1 + ratio) / (e1 - e0) else ratio
        return moved

    def _matches(self, preview: _Preview, count: int, last: list[float], recorded: list | None) -> bool | None:
        """Whether the scheduler and the step records still follow ``preview`` (None: cannot tell).

        The scheduler's LRs are those of its count (or of the step before: it may be inside
        ``step()``); the newest record's are those the preview places at its step. Each
        within one step either way, as the placement and the reads are.
        """
        i = count - preview.base
        lrs = preview.lrs
        if i < 0 or (i >= len(lrs) and not preview.ended):
            return False
        if i >= len(lrs):
            return None  # past the end of a schedule that ended
        if not any(_close(last, lrs[j]) for j in (i - 1, i, i + 1) if 0 <= j < len(lrs)):
            return False
        at = math.floor((self._step - preview.first_step) / (self._ratio or 1.0))
        if recorded is not None and 0 <= at < len(lrs):
            if not any(_close(recorded, lrs[j]) for j in (at - 1, at, at + 1) if 0 <= j < len(lrs)):
                return False
        return True

    def _request(self, sched) -> None:
        """Copy the scheduler (here: cheap) and queue the stepping of the copy (there: long)."""
        for _ in range(3):
            before = (schedule.counter(sched), id(getattr(sched, "_last_lr", None)))
            try:
                copy_ = schedule.twin(sched)
            except Exception:  # a state deepcopy cannot copy: say so, never fail the flush
                log.exception("could not copy the scheduler")
                self._reason = "scheduler cannot be copied"
                return
            # The training thread may have stepped the scheduler while it was copied.
            if (schedule.counter(sched), id(getattr(sched, "_last_lr", None))) == before:
                break
        else:
            return
        ratio = self._ratio or 1.0
        # Once a step, the LRs of count c are those of optimizer step c - offset + 1.
        first = before[0] - (self._offset or 0) + 1
        if ratio > 1 and self._changes:
            # The current LRs hold from the scheduler's last step on: where the records show
            # the LR moving, else just after the flush that saw the count move.
            moved_at = self._changes[-1][0]
            first = self._lr_moved_at if moved_at - ratio < self._lr_moved_at <= moved_at + 1 else moved_at + 1
        end = schedule.natural_end(sched)
        run_end = self._run_end()
        if run_end is not None and run_end > first:
            ahead = math.ceil((run_end - first) / ratio) + 1
        elif end is not None and end > before[0]:
            ahead = end - before[0] + 1
        else:
            ahead = max(8, math.ceil(AHEAD_STEPS / ratio))
        job = _Preview(before[0], [], False, self._step, first, end, self._generation)
        self._pending = True
        with self._lock:
            self._job = (copy_, min(ahead, MAX_AHEAD), job)
            self._idle.clear()
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="ptdash-schedule", daemon=True)
            self._thread.start()
        self._wake.set()

    def _message(self, preview: _Preview) -> list[Schedule]:
        ratio = self._ratio or 1.0

        def step_of(i: int) -> int:
            return preview.first_step + round(i * ratio)

        steps: list[int] = []
        values: list[list[float]] = []
        for i, lrs in enumerate(preview.lrs):
            steps.append(step_of(i))
            values.append(lrs)
            if ratio > 1:  # held until the scheduler's next step
                steps.append(step_of(i + 1) - 1)
                values.append(lrs)
        groups = len(values[0]) if values else 0
        keep = decimate(values, max(16, min(POINTS, 4000 // max(1, groups))))
        end = None
        if preview.ended:
            end = step_of(len(preview.lrs) - 1) - 1
        elif preview.end is not None and preview.end >= preview.base:
            end = step_of(preview.end - preview.base) - 1
        if end is not None:
            self._on_end(end)
        msg = Schedule(step=preview.step, steps=[steps[i] for i in keep],
                       lrs=[[values[i][g] for i in keep] for g in range(groups)], end=end)
        self.latest = msg
        return [msg]

    def _note(self, note: str) -> list[Schedule]:
        """Say (once) why there is no schedule ahead."""
        if self.latest is not None and self.latest.note == note:
            return []
        self._preview = None
        self.latest = Schedule(step=self._step, note=note)
        return [self.latest]

    # ---------------------------------------------------------------- preview thread

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            with self._lock:
                job, self._job = self._job, None
            if job is None:
                continue
            copy_, ahead, preview = job
            try:
                lrs, ended = schedule.advance(copy_, 0)
                while not ended and len(lrs) <= ahead and not self._stop.is_set():
                    more, ended = schedule.advance(copy_, min(ahead + 1 - len(lrs), _CHUNK))
                    lrs += more[1:]
                    time.sleep(0)  # let the training thread have the GIL between chunks
            except Exception:  # a scheduler's own error: no preview, and never a failed flush
                log.exception("schedule preview failed")
                lrs, ended = [], False
            preview.lrs, preview.ended = lrs, ended
            with self._lock:
                self._done = preview
                self._idle.set()

    def wait(self, timeout: float = 30.0) -> bool:
        """Block until the preview being computed is ready for the next ``observe`` (True),
        or ``timeout`` passed; at once when none is. For tests and benchmarks."""
        return not self._pending or self._idle.wait(timeout)

    def close(self) -> None:
        """Stop the preview's thread (it holds nothing that needs saving)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=2)


def decimate(values: list[list[float]], most: int) -> list[int]:
    """Indices of at most about ``most`` points that draw ``values`` faithfully.

    A piecewise-constant schedule (StepLR, an epoch-stepped one) keeps both corners of
    every change, so its steps stay square; a smooth one keeps evenly spaced points.
    """
    n = len(values)
    if n <= most:
        return list(range(n))
    changes = [i for i in range(1, n) if values[i] != values[i - 1]]
    if 2 * len(changes) + 2 <= most:
        return sorted({0, n - 1, *changes, *(i - 1 for i in changes)})
    stride = (n - 1) / (most - 1)
    return sorted({round(k * stride) for k in range(most)} | {n - 1})


def _close(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        x is not None and y is not None and abs(x - y) <= 1e-9 * max(abs(x), abs(y)) for x, y in zip(a, b))
