"""Whether a step's loss or gradient norm is a spike: far outside its own recent noise.

A value is judged against a rolling window of the good values before it: its median plus
``SPIKE_Z`` robust deviations (1.4826 x the median absolute deviation, at least
``FLOOR`` x the median's size), and ``TAIL`` times as far above the median as the
window's highest value, whichever is higher. A falling loss (warm-up) keeps its median
above the new values, and a heavy-tailed one (reinforcement learning, where a few batches
in a hundred are 5x the median) sets its own highest value, so neither trips it; a ratio to a running average (3x)
trips on both. A bad shard's batch, orders of magnitude off, trips it. Only values above count: a loss that
drops is never a spike. A gradient norm must also have jumped there: be JUMP times as far above
the median as the good norm before it. A norm that climbs 1.25x a step for ten steps as a model
starts to fit ends far above a limit taken a few steps earlier, yet no step of it is a jump (seen
on a GPU, where a flush judges hundreds of rows against the limits before them). A loss is judged
by the limit alone: the training thread reads a CPU loss against it and nothing more. Pure Python,
no torch: the flusher updates the limits from host values, and the training thread compares a
float with them.
"""

from __future__ import annotations

import collections
import math

SPIKE_Z = 8.0
"""Robust deviations above the window's median that make a spike."""
FLOOR = 0.1
"""The spread is taken as at least this share of the median's size: a flat loss whose
noise is tiny does not make every small bump a spike."""
TAIL = 10.0
"""A spike is also this many times as far above the median as the window's highest value.
Ten, not three: a heavy-tailed healthy loss (a critic's, a 2% share of batches 3x the rest)
passed median + 3x the highest about once in 2,000 steps (tests/unit/test_judge.py), while a
wild batch is orders of magnitude off (x1e4 inputs: a loss 1e8 times the median)."""
JUMP = 3.0
"""A gradient norm's spike must be this many times as far above the median as the good norm before it."""
WINDOW = 256
"""Good values the limits are taken over."""
WARMUP = 32
"""Good values needed before anything is judged a spike (a non-finite value always is)."""


def limit(values) -> float:
    """The value above which one is a spike, given the good ``values`` before it (inf when
    there are fewer than WARMUP)."""
    return limits(values)[0]


def limits(values) -> tuple[float, float]:
    """``(limit, median)`` of the good ``values``: ``(inf, nan)`` when there are fewer than WARMUP."""
    if len(values) < WARMUP:
        return math.inf, math.nan
    ordered = sorted(values)
    median = _median(ordered)
    mad = _median(sorted(abs(v - median) for v in ordered))
    spread = max(1.4826 * mad, FLOOR * abs(median), 1e-12)
    return max(median + SPIKE_Z * spread, median + TAIL * (ordered[-1] - median)), median


def _median(ordered: list[float]) -> float:
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


class Window:
    """The recent good values of one series and the limit they set."""

    def __init__(self, size: int = WINDOW) -> None:
        self.values: collections.deque[float] = collections.deque(maxlen=size)
        self.limit = math.inf
        self.median = math.nan
        self._added = 0

    def add(self, value: float) -> None:
        """A good value; until the window is full, every WARMUP of them the limit is taken again,
        so that the many rows of a first flush (fast steps on a GPU: hundreds) are judged by the
        values before them. A full window's limit is taken once a flush (``update``): taking it
        costs a few hundred microseconds of the flusher's GIL, which a GPU's training thread
        needs to launch its kernels."""
        values = self.values
        values.append(value)
        self._added += 1
        if self._added % WARMUP == 0 and len(values) < values.maxlen:
            self.update()

    def update(self) -> float:
        """Take the limit from the values so far (the flusher, once a flush); one set before
        (by ``early``) stays until this window has values enough to judge."""
        found, median = limits(self.values)
        if found < math.inf:
            self.limit, self.median = found, median
        return self.limit

    def early(self, values: list[float]) -> None:
        """A first limit from ``values`` (the training thread, before the flusher has one)."""
        found, median = limits(values)
        if found < self.limit:
            self.limit, self.median = found, median

    @property
    def newest(self) -> float | None:
        """The newest good value, or None."""
        return self.values[-1] if self.values else None

    def over(self, value: float, before: float | None = None) -> bool:
        """Whether ``value`` is a spike: over the limit, and, given ``before`` (the newest good
        value), JUMP times as far above the median as that one: a jump, not a climb. (A gradient
        norm that grows 1.25x a step for ten steps as a model starts to fit is no spike, yet it
        ends far above a limit taken a few steps before.)"""
        return value > self.limit and (before is None or value - self.median > JUMP * (before - self.median))
