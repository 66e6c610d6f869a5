"""The run's history: an SQLite database in WAL mode inside the run dir.

The engine is the only writer, so nothing is lost while no dashboard is attached; any
number of readers (the dashboard, ``ptdash ls``, tests) can read it while it is written
and always see whole transactions. SQLite survives a crash mid-write: an interrupted
transaction is rolled back on the next open.

Stdlib only, so the terminal side can read it without importing torch.
"""

from __future__ import annotations

import json
import math
import sqlite3
import time
from pathlib import Path

STORE_NAME = "metrics.db"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS names (id INTEGER PRIMARY KEY, name TEXT UNIQUE NOT NULL);
CREATE TABLE IF NOT EXISTS scalars (
    name_id INTEGER NOT NULL, rank INTEGER NOT NULL, step INTEGER NOT NULL, value REAL,
    PRIMARY KEY (name_id, rank, step)
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


class StoreError(RuntimeError):
    """The store is missing or damaged; the message says which and how far it was read."""


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
        self._db.executescript(_SCHEMA)
        self._name_ids: dict[str, int] = dict(
            (name, id_) for id_, name in self._db.execute("SELECT id, name FROM names")
        )

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
            scalars, steps = [], []
            for step, wall, values in rows:
                steps.append((rank, step, wall))
                for name, value in values.items():
                    scalars.append((self._name_id(name), rank, step, value))
            for step, _wall, values in extra:
                for name, value in values.items():
                    scalars.append((self._name_id(name), rank, step, value))
            self._db.executemany("INSERT OR REPLACE INTO steps VALUES (?, ?, ?)", steps)
            self._db.executemany("INSERT OR REPLACE INTO scalars VALUES (?, ?, ?, ?)", scalars)
            self._db.executemany(
                "INSERT INTO events (wall, step, kind, message, data) VALUES (?, ?, ?, ?, ?)",
                [(w, s, k, m, json.dumps(d, allow_nan=False, default=str)) for w, s, k, m, d in events],
            )
            self._db.executemany(
                "INSERT OR REPLACE INTO blobs VALUES (?, ?, ?, ?)",
                [(kind, rank, step, data) for kind, step, data in blobs],
            )

    def set_meta(self, **values) -> None:
        """Store JSON-serialisable metadata under the given keys."""
        with self._transaction():
            self._db.executemany(
                "INSERT OR REPLACE INTO meta VALUES (?, ?)",
                [(k, json.dumps(v, default=str)) for k, v in values.items()],
            )

    def _transaction(self):
        db = self._db

        class _Tx:
            def __enter__(self):
                db.execute("BEGIN")

            def __exit__(self, exc_type, *_):
                db.execute("ROLLBACK" if exc_type else "COMMIT")

        return _Tx()

    def close(self) -> None:
        """Checkpoint the WAL into the main file and close."""
        try:
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            self._db.close()


class StoreReader:
    """Reads a run's history, live or finished, without ever writing to it."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        if not self.path.exists():
            raise StoreError(f"no metrics store at {self.path}")
        # Not mode=ro: a read-only connection cannot create the WAL index of a store whose
        # writer died, and the reader then sees nothing.
        self._db = sqlite3.connect(f"file:{self.path}?mode=rw", uri=True, check_same_thread=False)
        self._db.execute("PRAGMA query_only=1")
        try:
            self._db.execute("SELECT count(*) FROM names").fetchone()
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"metrics store {self.path} is unreadable: {exc}") from None

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> StoreReader:
        return self

    def __exit__(self, *_) -> None:
        self.close()

    def names(self) -> list[str]:
        """Every scalar series name, sorted."""
        return sorted(n for (n,) in self._db.execute("SELECT name FROM names"))

    def ranks(self) -> list[int]:
        """The ranks that recorded steps."""
        return [r for (r,) in self._db.execute("SELECT DISTINCT rank FROM steps ORDER BY rank")]

    def last_step(self, rank: int = 0) -> int | None:
        """The newest recorded step of ``rank``, None before the first."""
        (step,) = self._db.execute("SELECT max(step) FROM steps WHERE rank = ?", (rank,)).fetchone()
        return step

    def meta(self) -> dict:
        """All metadata, JSON-decoded."""
        return {k: json.loads(v) for k, v in self._db.execute("SELECT key, value FROM meta")}

    def series(self, name: str, rank: int = 0, max_points: int | None = None,
               after_step: int | None = None) -> tuple[list[int], list[float | None]]:
        """``(steps, values)`` of one series in step order.

        With ``max_points``, a long series is decimated in SQL to at most that many
        points, keeping each bucket's minimum and maximum so spikes survive.
        """
        row = self._db.execute("SELECT id FROM names WHERE name = ?", (name,)).fetchone()
        if row is None:
            return [], []
        where = "name_id = ? AND rank = ?" + (" AND step > ?" if after_step is not None else "")
        args: tuple = (row[0], rank) + ((after_step,) if after_step is not None else ())
        count, lo, hi = self._db.execute(
            f"SELECT count(*), min(step), max(step) FROM scalars WHERE {where}", args
        ).fetchone()
        if not count:
            return [], []
        if max_points is None or count <= max_points:
            pairs = self._db.execute(
                f"SELECT step, value FROM scalars WHERE {where} ORDER BY step", args
            ).fetchall()
        else:
            width = max(1, math.ceil((hi - lo + 1) / max(1, max_points // 2)))
            # SQLite returns the bare `step` column from the row holding the min (max).
            bucket = f"SELECT (step - {lo}) / {width} AS b, step, {{agg}}(value) FROM scalars WHERE {where} GROUP BY b"
            points = {s: v for _, s, v in self._db.execute(bucket.format(agg="min"), args)}
            points.update({s: v for _, s, v in self._db.execute(bucket.format(agg="max"), args)})
            pairs = sorted(points.items())
        return [s for s, _ in pairs], [v for _, v in pairs]

    def latest(self, rank: int = 0) -> tuple[int | None, dict[str, float | None]]:
        """The newest step of ``rank`` and every value recorded at it."""
        step = self.last_step(rank)
        if step is None:
            return None, {}
        values = dict(self._db.execute(
            "SELECT n.name, s.value FROM scalars s JOIN names n ON n.id = s.name_id "
            "WHERE s.rank = ? AND s.step = ?", (rank, step)))
        return step, values

    def walls(self, rank: int = 0, after_step: int | None = None) -> tuple[list[int], list[float]]:
        """``(steps, wall_times)`` of ``rank``."""
        rows = self._db.execute(
            "SELECT step, wall FROM steps WHERE rank = ? AND step > ? ORDER BY step",
            (rank, -1 if after_step is None else after_step)).fetchall()
        return [s for s, _ in rows], [w for _, w in rows]

    def events(self, after_id: int = 0) -> list[dict]:
        """Events newer than ``after_id``, oldest first, each with its ``id``."""
        rows = self._db.execute(
            "SELECT id, wall, step, kind, message, data FROM events WHERE id > ? ORDER BY id", (after_id,))
        return [dict(id=i, wall=w, step=s, kind=k, message=m, data=json.loads(d)) for i, w, s, k, m, d in rows]

    def blobs(self, kind: str, rank: int = 0, after_step: int = -1, limit: int | None = None) -> list[tuple[int, bytes]]:
        """``(step, data)`` of one blob kind, oldest first (newest ``limit`` when given)."""
        if limit is None:
            rows = self._db.execute(
                "SELECT step, data FROM blobs WHERE kind = ? AND rank = ? AND step > ? ORDER BY step",
                (kind, rank, after_step)).fetchall()
        else:
            rows = self._db.execute(
                "SELECT step, data FROM blobs WHERE kind = ? AND rank = ? AND step > ? ORDER BY step DESC LIMIT ?",
                (kind, rank, after_step, limit)).fetchall()[::-1]
        return rows


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
