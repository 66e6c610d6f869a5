"""Min/max decimation: long series drawn in few points, with every spike kept.

Three shapes of the one idea, each keeping a bucket's minimum and maximum (and a series'
first and last points, so its x range holds):

- ``merge_point``: the fold of one point into a bucket, which the store's summary table
  keeps per 16, 256 and 4096 steps as it writes (``store``), and reads back (``reader``);
- ``StreamDecimator``: a stream of unknown length, read row by row from a damaged store;
- ``decimate``: a list in memory (the dashboard's series buffers).

Stdlib only.
"""

from __future__ import annotations


def merge_point(bucket: list | None, step: int, value: float | None) -> list:
    """Fold one point into ``[lo_step, lo, hi_step, hi]`` (a new bucket when None)."""
    if bucket is None:
        return [step, value, step, value]
    if value is None:
        if bucket[1] is None:
            bucket[0], bucket[2] = min(bucket[0], step), min(bucket[2], step)
        return bucket
    if bucket[1] is None or value < bucket[1]:
        bucket[0], bucket[1] = step, value
    if bucket[3] is None or value > bucket[3]:
        bucket[2], bucket[3] = step, value
    return bucket


class StreamDecimator:
    """Min/max decimation of a stream of unknown length: buckets double in width as needed.

    Like the decimated reads of an intact store, it keeps the first and last points.
    """

    def __init__(self, groups: int) -> None:
        self.groups = groups
        self.width = 1
        self.origin: int | None = None
        self.buckets: dict[int, list] = {}
        self.ends: dict[str, tuple[int, float | None]] = {}

    def add(self, step: int, value: float | None) -> None:
        if self.origin is None:
            self.origin = step
            self.ends["first"] = (step, value)
        self.ends["last"] = (step, value)
        index = (step - self.origin) // self.width
        self.buckets[index] = merge_point(self.buckets.get(index), step, value)
        if len(self.buckets) > self.groups:
            self.width *= 2
            merged: dict[int, list] = {}
            for index, (s1, v1, s2, v2) in sorted(self.buckets.items()):
                target = merged.get(index // 2)
                target = merge_point(target, s1, v1)
                merged[index // 2] = merge_point(target, s2, v2)
            self.buckets = merged

    def points(self) -> list:
        points = dict(self.ends.values())
        for s1, v1, s2, v2 in self.buckets.values():
            points[s1], points[s2] = v1, v2
        return sorted(points.items())


def decimate(steps: list[int], values: list[float | None], n: int) -> tuple[list[int], list[float | None]]:
    """At most ``n`` points of a series, keeping each bucket's minimum and maximum.

    Buckets are equal runs of points; each contributes its min and max (in step order),
    so a one-step spike survives any amount of decimation. The first and last points
    are always kept, so the x range does not shrink. None values (non-finite) are
    skipped inside a bucket; a bucket of only None keeps one None, so the gap stays
    visible.
    """
    count = len(steps)
    if count <= n:
        return list(steps), list(values)
    if n < 4:
        return [steps[0], steps[-1]], [values[0], values[-1]]
    buckets = (n - 2) // 2
    out_s, out_v = [steps[0]], [values[0]]
    inner = count - 2
    for b in range(buckets):
        lo = 1 + b * inner // buckets
        hi = 1 + (b + 1) * inner // buckets
        i_min = i_max = -1
        for i in range(lo, hi):
            v = values[i]
            if v is None:
                continue
            if i_min < 0 or v < values[i_min]:
                i_min = i
            if i_max < 0 or v > values[i_max]:
                i_max = i
        if i_min < 0:
            if hi > lo:
                out_s.append(steps[lo])
                out_v.append(None)
            continue
        for i in sorted({i_min, i_max}):
            out_s.append(steps[i])
            out_v.append(values[i])
    out_s.append(steps[-1])
    out_v.append(values[-1])
    return out_s, out_v
