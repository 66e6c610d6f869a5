"""The run's history: an SQLite database in WAL mode inside the run dir.

The engine is the only writer, so nothing is lost while no dashboard is attached; any
number of readers (the dashboard, ``ptdash ls``, tests) can read it while it is written
and always see whole transactions. SQLite survives a crash mid-write: an interrupted
transaction is rolled back on the next open.

Long runs: next to the raw scalars the writer keeps a summary table, the minimum and
maximum (with their steps) of every series over buckets of 16, 256 and 4096 steps,
updated in the same transaction as the rows. A decimated read of a million-step series
then reads a few thousand summary rows instead of scanning a million.

Damage: a store cut short or with flipped bytes is read up to the damage. Readers never
raise on it; they return what they could read and keep a one-line ``StoreError`` in
``StoreReader.damage`` (and log it).

Stdlib only, so the terminal side can read it without importing torch.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger("ptdash.shared.store")

STORE_NAME = "metrics.db"

LEVELS = (16, 256, 4096)
"""Steps per summary bucket, finest first."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS names (id INTEGER PRIMARY KEY, name TEXT UNIQUE NOT NULL);
CREATE TABLE IF NOT EXISTS scalars (
    name_id INTEGER NOT NULL, rank INTEGER NOT NULL, step INTEGER NOT NULL, value REAL,
    PRIMARY KEY (name_id, rank, step)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS summary (
    level INTEGER NOT NULL, name_id INTEGER NOT NULL, rank INTEGER NOT NULL, bucket INTEGER NOT NULL,
    lo_step INTEGER NOT NULL, lo REAL, hi_step INTEGER NOT NULL, hi REAL,
    PRIMARY KEY (level, name_id, rank, bucket)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS steps (
    rank INTEGER NOT NULL, step INTEGER NOT NULL, wall REAL NOT NULL,
    PRIMARY KEY (rank, step)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT, wall REAL NOT NULL, step INTEGER NOT NULL,
    kind TEXT NOT NULL, message TEXT NOT NULL, data TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS blobs (
    kind TEXT NOT NULL, rank INTEGER NOT NULL, step INTEGER NOT NULL, data BLOB NOT NULL,
    PRIMARY KEY (kind, rank, step)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""

# A bucket's extremes merge with a new bucket's: the lower minimum and higher maximum win;
# a bucket of only None values keeps its first step with a None value.
_UPSERT = """
INSERT INTO summary VALUES (?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (level, name_id, rank, bucket) DO UPDATE SET
    lo_step = CASE WHEN excluded.lo < lo OR (lo IS NULL AND (excluded.lo IS NOT NULL
                   OR excluded.lo_step < lo_step)) THEN excluded.lo_step ELSE lo_step END,
    lo = CASE WHEN excluded.lo < lo OR lo IS NULL THEN excluded.lo ELSE lo END,
    hi_step = CASE WHEN excluded.hi > hi OR (hi IS NULL AND (excluded.hi IS NOT NULL
                   OR excluded.hi_step < hi_step)) THEN excluded.hi_step ELSE hi_step END,
    hi = CASE WHEN excluded.hi > hi OR hi IS NULL THEN excluded.hi ELSE hi END
"""


class StoreError(RuntimeError):
    """The store is missing or damaged; the message says which and how far it was read."""


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


class StoreWriter:
    """Appends the run's history. Used from one thread of the engine (its flusher)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        # check_same_thread=False: the writer is created on the main thread and then used
        # only by the flusher thread.
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        # NORMAL in WAL mode: a crash of the process loses nothing committed; a power loss
        # may lose the last transactions but never corrupts the file.
        self._db.execute("PRAGMA synchronous=NORMAL")
        # One transaction: a reader never sees some of the tables without the others.
        self._db.executescript(f"BEGIN; {_SCHEMA} COMMIT;")
        self._name_ids: dict[str, int] = dict(
            (name, id_) for id_, name in self._db.execute("SELECT id, name FROM names")
        )
        self._last: dict[tuple[int, int], float] = {}
        """Newest stored step of each (name id, rank): older steps are rewrites."""

    def _name_id(self, name: str) -> int:
        id_ = self._name_ids.get(name)
        if id_ is None:
            cur = self._db.execute("INSERT OR IGNORE INTO names (name) VALUES (?)", (name,))
            id_ = cur.lastrowid if cur.rowcount else self._db.execute(
                "SELECT id FROM names WHERE name = ?", (name,)
            ).fetchone()[0]
            self._name_ids[name] = id_
        return id_

    def write(self, rows=(), rank: int = 0, events=(), blobs=(), extra=()) -> None:
        """Write one flush in a single transaction.

        ``rows``: ``[step, wall, {name: value}]`` lists (value None for non-finite);
        ``events``: ``(wall, step, kind, message, data)`` tuples; ``blobs``:
        ``(kind, step, bytes)`` tuples (per-layer arrays and the like); ``extra``: rows
        of values sampled by time rather than by step (system metrics), stored as scalars
        at the given step without touching that step's wall time.
        """
        with self._transaction():
            ids = self._name_ids
            scalars, steps = [], []
            for step, wall, values in rows:
                steps.append((rank, step, wall))
                for name, value in values.items():
                    scalars.append((ids.get(name) or self._name_id(name), rank, step, value))
            for step, _wall, values in extra:
                for name, value in values.items():
                    scalars.append((ids.get(name) or self._name_id(name), rank, step, value))
            if steps:
                self._db.executemany("INSERT OR REPLACE INTO steps VALUES (?, ?, ?)", steps)
            if scalars:
                deltas, redo = self._plan_summary(scalars)
                self._db.executemany("INSERT OR REPLACE INTO scalars VALUES (?, ?, ?, ?)", scalars)
                self._update_summary(deltas, redo)
            if events:
                self._db.executemany(
                    "INSERT INTO events (wall, step, kind, message, data) VALUES (?, ?, ?, ?, ?)",
                    [(w, s, k, m, json.dumps(d, allow_nan=False, default=str)) for w, s, k, m, d in events],
                )
            if blobs:
                self._db.executemany(
                    "INSERT OR REPLACE INTO blobs VALUES (?, ?, ?, ?)",
                    [(kind, rank, step, data) for kind, step, data in blobs],
                )

    def _plan_summary(self, scalars: list[tuple]) -> tuple[dict[tuple, list], set[tuple]]:
        """How the flush's scalars change the summary, decided before they are inserted.

        New steps merge into their buckets (``deltas``): points into the finest level,
        then each level's buckets into the next. A step at or before the newest stored
        one may replace a value (a system sample taken again while paused), so its
        buckets are recomputed from the raw rows instead (``redo``).
        """
        by_series: dict[tuple[int, int], list] = {}
        for name_id, rank, step, value in scalars:
            by_series.setdefault((name_id, rank), []).append((step, value))
        deltas: dict[tuple, list] = {}
        redo: set[tuple] = set()
        finest = LEVELS[0]
        for key, points in by_series.items():
            last = self._last.get(key)
            if last is None:
                (last,) = self._db.execute(
                    "SELECT max(step) FROM scalars WHERE name_id = ? AND rank = ?", key).fetchone()
                last = -math.inf if last is None else last
            buckets: dict[int, list] = {}
            for step, value in points:
                if step <= last:
                    redo.update((level, *key, step // level) for level in LEVELS)
                else:
                    buckets[step // finest] = merge_point(buckets.get(step // finest), step, value)
                    last = step
            self._last[key] = last
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

    def _update_summary(self, deltas: dict[tuple, list], redo: set[tuple]) -> None:
        self._db.executemany(_UPSERT, [(*k, *b) for k, b in deltas.items() if k not in redo])
        for level, name_id, rank, index in redo:
            merged = None
            for step, value in self._db.execute(
                    "SELECT step, value FROM scalars WHERE name_id = ? AND rank = ? AND step >= ? AND step < ?",
                    (name_id, rank, index * level, (index + 1) * level)):
                merged = merge_point(merged, step, value)
            if merged is not None:
                self._db.execute("INSERT OR REPLACE INTO summary VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                                 (level, name_id, rank, index, *merged))

    def set_meta(self, **values) -> None:
        """Store JSON-serialisable metadata under the given keys."""
        with self._transaction():
            self._db.executemany(
                "INSERT OR REPLACE INTO meta VALUES (?, ?)",
                [(k, json.dumps(v, default=str)) for k, v in values.items()],
            )

    @contextmanager
    def _transaction(self):
        self._db.execute("BEGIN")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            # The in-memory newest steps may now be ahead of the store: look them up again.
            self._last.clear()
            raise
        self._db.execute("COMMIT")

    def close(self) -> None:
        """Checkpoint the WAL into the main file and close."""
        try:
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            self._db.close()


class StoreReader:
    """Reads a run's history, live or finished, without ever writing to it.

    Never raises on a damaged store once open: each method returns what it could read
    before the damage, and ``damage`` holds the first problem met as a one-line
    StoreError (also logged). Values that are not finite numbers read as None.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.damage: StoreError | None = None
        """The first damage met, as one line; None while everything read was whole."""
        self._cut: str | None = None
        self._cut_only = False
        if not self.path.exists():
            raise StoreError(f"no metrics store at {self.path}")
        try:
            self._db = self._connect()
        except OSError as exc:
            raise StoreError(f"{self.path.name} is unreadable: {exc.strerror or exc}") from None
        try:
            self._db.execute("PRAGMA query_only=1")
            # Check each cell's size against its page: damage is reported, not misread.
            self._db.execute("PRAGMA cell_size_check=1")
            # A file shorter than its header says is refused whole unless the schema is
            # "writable"; with it, the pages that are there read and the missing ones
            # report damage where they are needed. query_only still forbids any write.
            self._db.execute("PRAGMA writable_schema=1")
            tables = {n for (n,) in self._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            self._db.execute("SELECT count(*) FROM names").fetchone()
            # A store written before the summary table existed has none, or an empty one
            # if a later writer opened it: its long series are decimated from raw rows.
            self._summary = "summary" in tables and self._db.execute(
                "SELECT EXISTS (SELECT 1 FROM summary) OR NOT EXISTS (SELECT 1 FROM scalars)").fetchone()[0] == 1
        except sqlite3.DatabaseError as exc:
            self._db.close()
            raise StoreError(f"{self.path.name} is unreadable: {exc}" + (f" ({self._cut})" if self._cut else "")) from None
        if self._cut:
            self._damaged(None, "")

    def _connect(self) -> sqlite3.Connection:
        """A connection to the store; to its whole pages only when the file ends inside a page.

        SQLite reads the missing end of a page as zeros, which can turn the last bytes of
        a value into other digits without any error. SQLite always writes whole pages, so
        a file cut inside one is damaged: its whole pages are read into memory instead and
        the torn page reads as missing, which SQLite reports.
        """
        with open(self.path, "rb") as f:
            header = f.read(100)
            size = os.fstat(f.fileno()).st_size
            page = int.from_bytes(header[16:18], "big") if len(header) == 100 else 0
            page = 65536 if page == 1 else page
            if header.startswith(b"SQLite format 3\0") and page >= 512 and size % page:
                whole = size - size % page
                self._cut = f"the file ends inside page {whole // page + 1}, at byte {size}"
                if not whole:
                    raise StoreError(f"{self.path.name} is unreadable: {self._cut}")
                data = bytearray(header + f.read(whole - len(header)))
                data[18] = data[19] = 1  # an in-memory copy cannot be in WAL mode
                db = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
                db.deserialize(bytes(data))
                return db
        # Not mode=ro: a read-only connection cannot create the WAL index of a store whose
        # writer died, and the reader then sees nothing.
        return sqlite3.connect(f"file:{self.path}?mode=rw", uri=True, check_same_thread=False,
                               isolation_level=None)

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> StoreReader:
        return self

    def __exit__(self, *_) -> None:
        self.close()

    def check(self) -> None:
        """Raise the StoreError met so far, if any."""
        if self.damage is not None:
            raise self.damage

    def _damaged(self, exc: BaseException | None, where: str, read: str = "") -> None:
        """Keep the first damage met (a torn last page alone gives way to what it broke)."""
        if self.damage is not None and not self._cut_only:
            return
        self._cut_only = exc is None
        if exc is None:
            self.damage = StoreError(f"{self.path.name} is damaged: {self._cut}")
        else:
            text = str(exc).splitlines()[0] if str(exc).strip() else type(exc).__name__
            self.damage = StoreError(f"{self.path.name} is damaged {where}: {text}{read}"
                                     + (f" ({self._cut})" if self._cut else ""))
        log.info("%s", self.damage)

    @contextmanager
    def _snapshot(self):
        """One read transaction: every query inside sees the same committed state."""
        self._db.execute("BEGIN")
        try:
            yield
        finally:
            try:
                self._db.execute("COMMIT")
            except sqlite3.DatabaseError:
                pass

    def names(self) -> list[str]:
        """Every scalar series name, sorted."""
        return sorted(n for n in self._rows("SELECT name FROM names", (), "in its list of names", one=True)
                      if isinstance(n, str))

    def ranks(self) -> list[int]:
        """The ranks that recorded steps."""
        # One key lookup per rank: DISTINCT would scan every step of every rank.
        ranks: list[int] = []
        while True:
            found = self._rows("SELECT min(rank) FROM steps WHERE rank > ?", (ranks[-1] if ranks else -2 ** 63,),
                               "in its steps", one=True)
            if not found or not isinstance(found[0], int):
                return ranks
            ranks.append(found[0])

    def last_step(self, rank: int = 0) -> int | None:
        """The newest recorded step of ``rank``, None before the first."""
        rows = self._rows("SELECT max(step) FROM steps WHERE rank = ?", (rank,), "in its steps", one=True)
        return rows[0] if rows and isinstance(rows[0], int) else None

    def meta(self) -> dict:
        """All metadata, JSON-decoded (entries that do not decode are left out)."""
        out = {}
        for key, value in self._rows("SELECT key, value FROM meta", (), "in its metadata"):
            try:
                out[key] = json.loads(value)
            except (TypeError, ValueError) as exc:
                self._damaged(exc, f"in its metadata ({key!r})")
        return out

    def _rows(self, sql: str, args: tuple, what: str, one: bool = False) -> list:
        """The rows of a query, up to the first damaged page."""
        out = []
        try:
            for row in self._db.execute(sql, args):
                out.append(row[0] if one else row)
        except sqlite3.DatabaseError as exc:
            self._damaged(exc, what)
        return out

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
        decimator = _Decimator(max(1, (max_points or 0) // 2 - 1)) if max_points else None
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

    def latest(self, rank: int = 0) -> tuple[int | None, dict[str, float | None]]:
        """The newest step of ``rank`` and every value recorded at it."""
        step = self.last_step(rank)
        if step is None:
            return None, {}
        rows = self._rows(
            # CROSS JOIN keeps names as the outer loop: one key lookup per name, no scan.
            "SELECT n.name, s.value FROM names n CROSS JOIN scalars s ON s.name_id = n.id "
            "AND s.rank = ? AND s.step = ?", (rank, step), f"at step {step}")
        return step, {n: _number(v) for n, v in rows if isinstance(n, str)}

    def walls(self, rank: int = 0, after_step: int | None = None) -> tuple[list[int], list[float]]:
        """``(steps, wall_times)`` of ``rank``."""
        steps, walls = [], []
        try:
            for step, wall in self._db.execute(
                    "SELECT step, wall FROM steps WHERE rank = ? AND step > ? ORDER BY step",
                    (rank, -(2 ** 63) if after_step is None else after_step)):
                if type(step) is int and isinstance(wall, float) and math.isfinite(wall):
                    steps.append(step)
                    walls.append(wall)
        except sqlite3.DatabaseError as exc:
            where = f"after step {steps[-1]}" if steps else "before its first step"
            self._damaged(exc, f"{where} of the step times", f"; {len(steps)} steps were read")
        return steps, walls

    def events(self, after_id: int = 0) -> list[dict]:
        """Events newer than ``after_id``, oldest first, each with its ``id``."""
        out = []
        for i, w, s, k, m, d in self._rows(
                "SELECT id, wall, step, kind, message, data FROM events WHERE id > ? ORDER BY id",
                (after_id,), "in its events"):
            try:
                data = json.loads(d)
            except (TypeError, ValueError) as exc:
                self._damaged(exc, f"in event {i}")
                continue
            if isinstance(k, str) and isinstance(m, str) and type(s) is int and isinstance(w, (int, float)):
                out.append(dict(id=i, wall=w, step=s, kind=k, message=m, data=data))
        return out

    def blobs(self, kind: str, rank: int = 0, after_step: int = -1, limit: int | None = None) -> list[tuple[int, bytes]]:
        """``(step, data)`` of one blob kind, oldest first (newest ``limit`` when given)."""
        if limit is None:
            rows = self._rows(
                "SELECT step, data FROM blobs WHERE kind = ? AND rank = ? AND step > ? ORDER BY step",
                (kind, rank, after_step), f"in its {kind} records")
        else:
            rows = self._rows(
                "SELECT step, data FROM blobs WHERE kind = ? AND rank = ? AND step > ? ORDER BY step DESC LIMIT ?",
                (kind, rank, after_step, limit), f"in its {kind} records")[::-1]
        return [(s, d) for s, d in rows if type(s) is int and isinstance(d, bytes)]


def _number(value) -> float | None:
    """A stored value as the float it should be; anything else (damage) reads as None."""
    if type(value) is float:
        return value if math.isfinite(value) else None
    if type(value) is int:
        return float(value)
    return None


class _Decimator:
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


def wait_for_store(path: Path, timeout: float) -> StoreReader | None:
    """Open the store once the engine has created it; None if it has not within ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return StoreReader(path)
        except StoreError:
            if time.monotonic() > deadline:
                return None
            time.sleep(0.05)
