"""One metric's history as the dashboard keeps it, and the step rate from wall times.

``Series`` is an append-only buffer that decimates itself (min/max per bucket) when it
grows, so a run of a million steps costs bounded memory and drawing time while spikes
survive. Pure: no Textual, tested on plain lists.
"""

from __future__ import annotations

import bisect
from collections import deque

from ptdash.shared import names
from ptdash.shared.decimate import decimate

SERIES_CAP = 8000
"""Points a series buffer holds before it decimates itself to half of that."""

RANK_SERIES = (names.LOSS, names.STEP_S, names.DATA_S, names.SAMPLES_PER_S)
"""The series by step kept of ranks other than 0 (the Ranks tab's columns); their host and
GPU readings come by time, as every rank's do."""

def rank_wants(name: str) -> bool:
    """Whether the Ranks tab reads series ``name`` (by step) of every rank."""
    return name in RANK_SERIES


class Series:
    """One metric's points in step order: append-only, decimating itself when it grows.

    Live rows are appended at full resolution; when the buffer passes ``cap`` points the
    whole of it is decimated to ``cap // 2`` (min/max per bucket), so memory and drawing
    cost stay bounded on a run of a million steps while spikes survive.
    """

    def __init__(self, cap: int = SERIES_CAP) -> None:
        self.cap = cap
        self.steps: list[int] = []
        self.values: list[float | None] = []
        self.version = 0
        """Bumped on every change, so a chart redraws only when its data moved."""

    def __len__(self) -> int:
        return len(self.steps)

    @property
    def last_step(self) -> int | None:
        return self.steps[-1] if self.steps else None

    def latest(self) -> float | None:
        """The newest value (None when empty or non-finite)."""
        return self.values[-1] if self.values else None

    def value_at(self, step: int) -> float | None:
        """The value at exactly ``step``, None when the series has none there."""
        i = bisect.bisect_left(self.steps, step)
        return self.values[i] if i < len(self.steps) and self.steps[i] == step else None

    def extend(self, steps: list[int], values: list[float | None]) -> None:
        """Append points newer than the last one; older ones are ignored."""
        last = self.last_step
        for s, v in zip(steps, values):
            if last is None or s > last:
                self.steps.append(s)
                self.values.append(v)
                last = s
        self._settle()

    def append(self, step: int, value: float | None) -> None:
        """Append one point if it is newer than the last one."""
        if not self.steps or step > self.steps[-1]:
            self.steps.append(step)
            self.values.append(value)
            self._settle()

    def merge(self, steps: list[int], values: list[float | None]) -> None:
        """Insert points anywhere (a gap read back from the store); existing steps win."""
        for s, v in zip(steps, values):
            i = bisect.bisect_left(self.steps, s)
            if i < len(self.steps) and self.steps[i] == s:
                continue
            self.steps.insert(i, s)
            self.values.insert(i, v)
        self._settle()

    def _settle(self) -> None:
        if len(self.steps) > self.cap:
            self.steps, self.values = decimate(self.steps, self.values, self.cap // 2)
        self.version += 1


class StepRate:
    """Steps per second from the wall times of recent steps, over running time only.

    ``pause(wall)`` and ``resume(wall)`` mark when the run stood still (from the events
    that say so); that time is left out, so a resumed run's rate is its running rate.
    """

    def __init__(self, window_s: float = 30.0, max_points: int = 256) -> None:
        self.window_s = window_s
        self._points: deque[tuple[int, float]] = deque(maxlen=max_points)
        self._paused: deque[list] = deque(maxlen=64)
        """``[start, end or None]`` wall times of recent pauses, oldest first."""

    def pause(self, wall: float) -> None:
        """The run paused at wall time ``wall``."""
        if not self._paused or self._paused[-1][1] is not None:
            self._paused.append([wall, None])

    def resume(self, wall: float) -> None:
        """The run went on at wall time ``wall``."""
        if self._paused and self._paused[-1][1] is None:
            self._paused[-1][1] = wall

    def _paused_within(self, start: float, end: float) -> float:
        return sum(max(0.0, min(end, b if b is not None else end) - max(start, a)) for a, b in self._paused)

    def add(self, step: int, wall: float) -> None:
        """Note that ``step`` ended at wall time ``wall`` (older steps are ignored)."""
        if not self._points or step > self._points[-1][0]:
            self._points.append((step, wall))

    def rate(self) -> float | None:
        """Steps per second over the last ``window_s`` seconds of steps, None when unknown."""
        if len(self._points) < 2:
            return None
        last_step, last_wall = self._points[-1]
        first_step, first_wall = self._points[0]
        for s, w in self._points:
            if w >= last_wall - self.window_s:
                first_step, first_wall = s, w
                break
        if last_step == first_step:
            first_step, first_wall = self._points[-2]
        span = last_wall - first_wall - self._paused_within(first_wall, last_wall)
        return (last_step - first_step) / span if span > 0 else None
