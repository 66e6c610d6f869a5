"""The store reader's queries over long series: by step and by time, decimated for a chart.

``SeriesQueries`` is the part of ``reader.StoreReader`` that answers "this series, in at
most N points": a long range by step is read from the summary table (min/max buckets at
a few levels) so the cost does not grow with the run's length, from raw rows where no
summary is there, and salvaged row by row past a damaged page; a series sampled by time
is bucketed by wall time. Stdlib only.
"""

from __future__ import annotations

import math
import sqlite3

from .decimate import StreamDecimator, merge_point
from .store import StoreError
from .summary import LEVELS


class SeriesQueries:
    """Series reads of a StoreReader, which provides the connection (``_db``), what the
    store holds (``_summary``, ``_samples``), ``_rows``, ``_snapshot`` and ``_damaged``."""

    def series(self, name: str, rank: int = 0, max_points: int | None = None,
               after_step: int | None = None) -> tuple[list[int], list[float | None]]:
        """``(steps, values)`` of one series in step order.

        With ``max_points``, a long series is decimated to at most that many points,
        keeping each bucket's minimum and maximum so spikes survive; a long range is
        read from the summary table, so the cost does not grow with the run's length.
        """
        try:
            with self._snapshot():
                pairs = self._series(name, rank, max_points, after_step)
        except (sqlite3.DatabaseError, TypeError, ValueError, OverflowError):
            pairs = self._salvage(name, rank, max_points, after_step)
        pairs = [p for p in pairs if type(p[0]) is int]
        return ([s for s, _ in pairs],
                [v if type(v) is float and -math.inf < v < math.inf else _number(v) for _, v in pairs])

    def _series(self, name: str, rank: int, max_points: int | None, after_step: int | None) -> list:
        row = self._db.execute("SELECT id FROM names WHERE name = ?", (name,)).fetchone()
        if row is None:
            return []
        first = -(2 ** 63) if after_step is None else after_step + 1
        args = (row[0], rank, first)
        where = "name_id = ? AND rank = ? AND step >= ?"
        (lo,) = self._db.execute(f"SELECT min(step) FROM scalars WHERE {where}", args).fetchone()
        (hi,) = self._db.execute(f"SELECT max(step) FROM scalars WHERE {where}", args).fetchone()
        if lo is None:
            return []
        raw = f"SELECT step, value FROM scalars WHERE {where} ORDER BY step"
        if max_points is None or hi - lo < max_points:
            return self._db.execute(raw, args).fetchall()
        (count,) = self._db.execute(
            f"SELECT count(*) FROM (SELECT 1 FROM scalars WHERE {where} LIMIT ?)", (*args, max_points + 1)
        ).fetchone()
        if count <= max_points:
            return self._db.execute(raw, args).fetchall()
        # Each group gives its minimum and maximum; the first and last points are added so
        # the chart's x range is the series' own.
        groups = max(1, max_points // 2 - 1)
        width = math.ceil((hi - lo + 1) / groups)
        level = max((L for L in LEVELS if L <= width), default=None)
        if level is None or not self._summary:
            # SQLite returns the bare `step` column from the row holding the min (max).
            bucket = (f"SELECT (step - {lo}) / {width} AS b, step, {{agg}}(value) FROM scalars "
                      f"WHERE {where} GROUP BY b")
            points = {s: v for _, s, v in self._db.execute(bucket.format(agg="min"), args)}
            points.update({s: v for _, s, v in self._db.execute(bucket.format(agg="max"), args)})
        else:
            points = self._from_summary(row[0], rank, level, lo, hi, groups)
        points.update(self._db.execute(
            "SELECT step, value FROM scalars WHERE name_id = ? AND rank = ? AND step IN (?, ?)",
            (row[0], rank, lo, hi)))
        return sorted(points.items())

    def _from_summary(self, name_id: int, rank: int, level: int, lo: int, hi: int, groups: int) -> dict:
        """Decimate ``[lo, hi]`` from the summary buckets of ``level`` into ``{step: value}``.

        A first bucket that starts before ``lo`` (a read after a given step) is folded
        from the raw rows; every other bucket lies wholly in the range.
        """
        first, last = lo // level, hi // level
        points: dict[int, float | None] = {}
        if lo > first * level:
            head = None
            for step, value in self._db.execute(
                    "SELECT step, value FROM scalars WHERE name_id = ? AND rank = ? AND step >= ? AND step < ?",
                    (name_id, rank, lo, (first + 1) * level)):
                head = merge_point(head, step, value)
            if head is not None:
                points[head[0]], points[head[2]] = head[1], head[3]
            first, groups = first + 1, max(1, groups - 1)
        per_group = max(1, math.ceil((last - first + 1) / groups))
        group, lo_pt, hi_pt = None, None, None
        for index, lo_step, lo_value, hi_step, hi_value in self._db.execute(
                "SELECT bucket, lo_step, lo, hi_step, hi FROM summary "
                "WHERE level = ? AND name_id = ? AND rank = ? AND bucket BETWEEN ? AND ? ORDER BY bucket",
                (level, name_id, rank, first, last)):
            g = (index - first) // per_group
            if g != group:
                if group is not None:
                    points[lo_pt[0]], points[hi_pt[0]] = lo_pt[1], hi_pt[1]
                group, lo_pt, hi_pt = g, (lo_step, lo_value), (hi_step, hi_value)
                continue
            # A bucket of only None values has None extremes: it never wins over a number.
            if lo_value is not None and (lo_pt[1] is None or lo_value < lo_pt[1]):
                lo_pt = (lo_step, lo_value)
            if hi_value is not None and (hi_pt[1] is None or hi_value > hi_pt[1]):
                hi_pt = (hi_step, hi_value)
        if group is not None:
            points[lo_pt[0]], points[hi_pt[0]] = lo_pt[1], hi_pt[1]
        return points

    def _salvage(self, name: str, rank: int, max_points: int | None, after_step: int | None) -> list:
        """The points of a series before the damage, read row by row in step order."""
        decimator = StreamDecimator(max(1, (max_points or 0) // 2 - 1)) if max_points else None
        out, last, count = [], None, 0
        try:
            row = self._db.execute("SELECT id FROM names WHERE name = ?", (name,)).fetchone()
            if row is None:
                return []
            for step, value in self._db.execute(
                    "SELECT step, value FROM scalars WHERE name_id = ? AND rank = ? AND step > ? ORDER BY step",
                    (row[0], rank, -(2 ** 63) if after_step is None else after_step)):
                if type(step) is not int:
                    continue
                if decimator is not None:
                    decimator.add(step, _number(value))
                else:
                    out.append((step, value))
                last, count = step, count + 1
        except sqlite3.DatabaseError as exc:
            where = f"after step {last}" if last is not None else "before its first step"
            self._damaged(exc, f"{where} of {name!r}", f"; {count} steps were read")
        else:
            # The raw rows read whole: only the summary was damaged.
            self._damaged(StoreError("its summary table is unreadable"), f"in the summary of {name!r}",
                          f"; all {count} steps were read")
        return decimator.points() if decimator is not None else out

    def sampled(self, name: str, rank: int = 0, after_wall: float | None = None,
                max_points: int | None = None) -> tuple[list[float], list[float | None]]:
        """``(walls, values)`` of a series sampled by time, oldest first; with
        ``max_points``, a long one keeps each time bucket's minimum and maximum."""
        if not self._samples:
            return [], []
        found = self._rows("SELECT id FROM names WHERE name = ?", (name,), "in its list of names", one=True)
        if not found:
            return [], []
        args = (found[0], rank, -math.inf if after_wall is None else after_wall)
        where = "name_id = ? AND rank = ? AND wall > ?"
        count = self._rows(f"SELECT count(*) FROM samples WHERE {where}", args, "in its samples", one=True)
        if max_points is not None and count and count[0] > max_points:
            bounds = self._rows(f"SELECT min(wall), max(wall) FROM samples WHERE {where}", args, "in its samples")
            lo, hi = bounds[0]
            width = (hi - lo) / max(1, max_points // 2 - 1) or 1.0
            points: dict[float, float | None] = {}
            for agg in ("min", "max"):
                for _, wall, value in self._rows(
                        f"SELECT CAST((wall - ?) / ? AS INTEGER) AS b, wall, {agg}(value) FROM samples "
                        f"WHERE {where} GROUP BY b", (lo, width, *args), "in its samples"):
                    points[wall] = value
            pairs = sorted(points.items())
        else:
            pairs = self._rows(f"SELECT wall, value FROM samples WHERE {where} ORDER BY wall", args, "in its samples")
        pairs = [(w, v) for w, v in pairs if isinstance(w, float)]
        return [w for w, _ in pairs], [_number(v) for _, v in pairs]


def _number(value) -> float | None:
    """A stored value as the float it should be; anything else (damage) reads as None."""
    if type(value) is float:
        return value if math.isfinite(value) else None
    if type(value) is int:
        return float(value)
    return None
