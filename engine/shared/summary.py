"""The store's summary table: each series' minimum and maximum (and their steps) over
buckets of LEVELS steps, kept up to date in the transaction that writes the rows, so a
decimated read of a million-step series reads a few thousand summary rows (store.py).

Stdlib only.
"""

from __future__ import annotations

import bisect
import math
import operator
import sqlite3

from .decimate import merge_point
from .inserts import insert_many

LEVELS = (16, 256, 4096)
"""Steps per summary bucket, finest first."""

# A bucket's extremes merge with a new bucket's: the lower minimum and higher maximum win;
# a bucket of only None values keeps its first step with a None value.
_MERGE = """
ON CONFLICT (level, name_id, rank, bucket) DO UPDATE SET
    lo_step = CASE WHEN excluded.lo < lo OR (lo IS NULL AND (excluded.lo IS NOT NULL
                   OR excluded.lo_step < lo_step)) THEN excluded.lo_step ELSE lo_step END,
    lo = CASE WHEN excluded.lo < lo OR lo IS NULL THEN excluded.lo ELSE lo END,
    hi_step = CASE WHEN excluded.hi > hi OR (hi IS NULL AND (excluded.hi IS NOT NULL
                   OR excluded.hi_step < hi_step)) THEN excluded.hi_step ELSE hi_step END,
    hi = CASE WHEN excluded.hi > hi OR hi IS NULL THEN excluded.hi ELSE hi END
"""


def plan(db: sqlite3.Connection, last_steps: dict[tuple[int, int], float],
         by_series: dict[tuple[int, int], tuple[list, list]]) -> tuple[dict[tuple, list], set[tuple]]:
    """How a flush's points change the summary, decided before they are inserted.

    ``by_series``: (name id, rank) -> its steps and values, in row order;
    ``last_steps``: the newest stored step of each series (looked up once, then kept
    here). New steps merge into their buckets (``deltas``): points into the finest
    level, then each level's buckets into the next. A step at or before the newest
    stored one may replace a value (a system sample taken again while paused), so its
    buckets are recomputed from the raw rows instead (``redo``).
    """
    deltas: dict[tuple, list] = {}
    redo: set[tuple] = set()
    finest = LEVELS[0]
    for key, (steps, values) in by_series.items():
        last = last_steps.get(key)
        if last is None:
            (last,) = db.execute("SELECT max(step) FROM scalars WHERE name_id = ? AND rank = ?", key).fetchone()
            last = -math.inf if last is None else last
        buckets: dict[int, list] = {}
        if steps[0] > last and None not in values and all(map(operator.lt, steps, steps[1:])):
            _fold_run(buckets, steps, values)  # the usual flush: new steps, every value a number
            last = steps[-1]
        else:
            last = _fold_points(buckets, zip(steps, values), last, key, redo)
        last_steps[key] = last
        level = finest
        for coarser in (*LEVELS[1:], None):
            for index, bucket in buckets.items():
                deltas[(level, *key, index)] = bucket
            if coarser is None:
                break
            merged: dict[int, list] = {}
            for index, (lo_step, lo, hi_step, hi) in buckets.items():
                j = index * level // coarser
                merged[j] = merge_point(merge_point(merged.get(j), lo_step, lo), hi_step, hi)
            buckets, level = merged, coarser
    return deltas, redo


def _fold_run(buckets: dict[int, list], steps: list, values: list) -> None:
    """The finest buckets of new points (steps rising, every value a number), a bucket at
    a time in C: the earliest step of the lowest (highest) value wins, as in merge_point."""
    finest = LEVELS[0]
    i, n = 0, len(steps)
    while i < n:
        index = steps[i] // finest
        j = bisect.bisect_left(steps, (index + 1) * finest, i)
        part = steps[i:j]
        lo, lo_step = min(zip(values[i:j], part))
        hi, hi_step = max(zip(values[i:j], map(operator.neg, part)))
        buckets[index] = [lo_step, lo, -hi_step, hi]  # the steps rise: each bucket comes once
        i = j


def _fold_points(buckets: dict[int, list], points, last: float, key: tuple, redo: set) -> float:
    """Fold points one by one into the finest buckets (a flush with a None, or with steps
    that do not rise past ``last``, whose buckets are redone); returns the newest step."""
    finest = LEVELS[0]
    index = bucket = None
    for step, value in points:
        if step <= last:
            redo.update((level, *key, step // level) for level in LEVELS)
            continue
        last = step
        if step // finest != index:  # a bucket's new points come together: folded inline
            index = step // finest
            bucket = buckets.get(index)
            if bucket is None:
                bucket = buckets[index] = [step, value, step, value]
                continue
        if value is None or bucket[1] is None:
            merge_point(bucket, step, value)
        elif value < bucket[1]:  # merge_point's fold of two numbers, without the call
            bucket[0], bucket[1] = step, value
        elif value > bucket[3]:
            bucket[2], bucket[3] = step, value
    return last


def update(db: sqlite3.Connection, deltas: dict[tuple, list], redo: set[tuple]) -> None:
    """Apply ``plan``'s result, after the rows are inserted (a redone bucket reads them)."""
    insert_many(db, "INSERT INTO summary", 8, [(*k, *b) for k, b in deltas.items() if k not in redo], _MERGE)
    for level, name_id, rank, index in redo:
        merged = None
        for step, value in db.execute(
                "SELECT step, value FROM scalars WHERE name_id = ? AND rank = ? AND step >= ? AND step < ?",
                (name_id, rank, index * level, (index + 1) * level)):
            merged = merge_point(merged, step, value)
        if merged is not None:
            db.execute("INSERT OR REPLACE INTO summary VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                       (level, name_id, rank, index, *merged))
