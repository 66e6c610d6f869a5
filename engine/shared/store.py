"""The run's history: an SQLite database in WAL mode inside the run dir, and its writer.

The engine is the writer, so nothing is lost while no dashboard is attached (the one other
is ``append_event``: the notifier's single word that the user's command fails); any
number of readers (``reader.StoreReader``: the dashboard, ``ptdash ls``, exports, tests)
can read it while it is written and always see whole transactions. SQLite survives a
crash mid-write: an interrupted transaction is rolled back on the next open.

What is stored is what the protocol carries: scalar rows ``[step, wall, {name: value}]``,
``Event`` messages, and ``Layers`` / ``LayerNames`` / ``Schedule`` messages as the protocol's own dicts.

Long runs: next to the raw scalars the writer keeps a summary table, the minimum and
maximum (with their steps) of every series over buckets of 16, 256 and 4096 steps,
updated in the same transaction as the rows (summary.py). A decimated read
of a million-step series then reads a few thousand summary rows instead of scanning a
million.

Stdlib only, so the terminal side can read it without importing torch.
"""

from __future__ import annotations

import itertools
import json
import logging
import operator
import sqlite3
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from . import diskspace, perms, summary
from .inserts import insert_many
from .numbers import json_safe
from .protocol import Event, LayerNames, Layers, Schedule
from .wire import to_dict

log = logging.getLogger("ptdash.shared.store")

STORE_NAME = "metrics.db"

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
    kind TEXT NOT NULL, message TEXT NOT NULL, data TEXT NOT NULL, rank INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS blobs (
    kind TEXT NOT NULL, rank INTEGER NOT NULL, step INTEGER NOT NULL, data BLOB NOT NULL,
    PRIMARY KEY (kind, rank, step)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS samples (
    name_id INTEGER NOT NULL, rank INTEGER NOT NULL, wall REAL NOT NULL, value REAL,
    PRIMARY KEY (name_id, rank, wall)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""

WAL_CHECKPOINT_PAGES = 100
"""The WAL is checkpointed into the database once it holds this many pages (400 kB of 4 kB pages)."""
WAL_LIMIT_BYTES = 512_000
"""What the WAL is cut back to after a checkpoint."""

BACKLOG_ITEMS = 200_000
"""Items (rows, events, layer records) kept for a retry while the store cannot be written."""


@dataclass
class _Part:
    """One kind of a flush's items, written in one transaction (and retried as one)."""

    kind: str
    """``scalars`` (``items`` are rows by step), ``samples`` (rows by wall time), ``events`` or ``layers``."""
    rank: int
    items: list

    @property
    def size(self) -> int:
        return len(self.items)


class StoreError(RuntimeError):
    """The store is missing or damaged; the message says which and how far it was read."""


class StoreWriter:
    """Appends the run's history. Used from one thread of the engine (its flusher)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        # Made first with the run's file mode: SQLite gives its -wal and -shm files the
        # database's own mode, whatever the umask.
        perms.touch(self.path)
        # check_same_thread=False: the writer is created on the main thread and then used
        # only by the flusher thread.
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        # NORMAL in WAL mode: a crash of the process loses nothing committed; a power loss
        # may lose the last transactions but never corrupts the file.
        self._db.execute("PRAGMA synchronous=NORMAL")
        # A bounded WAL: checkpointed every WAL_CHECKPOINT_PAGES pages (SQLite's default,
        # 1,000 pages, let it grow to 4 MB and keep that size for ever), and cut back to
        # WAL_LIMIT_BYTES after each, so on a filling disk it never takes the room the
        # history needs (diskspace.STORE_HEADROOM_BYTES is kept free for it).
        self._db.execute(f"PRAGMA wal_autocheckpoint={WAL_CHECKPOINT_PAGES}")
        self._db.execute(f"PRAGMA journal_size_limit={WAL_LIMIT_BYTES}")
        # One transaction: a reader never sees some of the tables without the others.
        self._db.executescript(f"BEGIN; {_SCHEMA} COMMIT;")
        self._name_ids: dict[str, int] = dict(
            (name, id_) for id_, name in self._db.execute("SELECT id, name FROM names")
        )
        self._last: dict[tuple[int, int], float] = {}
        """Newest stored step of each (name id, rank): older steps are rewrites."""
        self._backlog: list[_Part] = []
        self._meta: dict[str, str] = {}
        """Metadata that waits for a retry."""
        self._notes: list[str] = []
        self._behind = False
        """Whether items wait for a retry (said once when it starts, once when it ends)."""
        self.rejected = 0
        """Items dropped because the database can never hold them."""
        self.lost = 0
        """Items dropped because the database could not be written for too long."""
        self.unwritten = 0
        """Items still unwritten when the writer closed (the disk stayed full)."""
        self.drawn = 0
        """Bytes of the run dir's reserve given back to the filesystem for the history."""
        self._drawing = False

    def _name_id(self, name: str) -> int:
        id_ = self._name_ids.get(name)
        if id_ is None:
            cur = self._db.execute("INSERT OR IGNORE INTO names (name) VALUES (?)", (name,))
            id_ = cur.lastrowid if cur.rowcount else self._db.execute(
                "SELECT id FROM names WHERE name = ?", (name,)
            ).fetchone()[0]
            self._name_ids[name] = id_
        return id_

    def write(self, rows=(), rank: int = 0, events: list[Event] = (),
              layers: list[Layers | LayerNames | Schedule] = (), samples=()) -> None:
        """Write one flush; never raises for what it is given.

        ``rows``: ``[step, wall, {name: value}]`` lists (value None for non-finite);
        ``events``: Event messages (each stored under its own ``rank``); ``layers``:
        Layers, LayerNames and Schedule messages, stored as the protocol's dicts (one per
        kind, rank and step); ``samples``: ``[wall, {name: value}]`` readings taken by
        time, not by step (host and GPU, once a second), so a run of slow steps keeps its
        whole history of them.

        Scalars, samples, events and layer records go in separate transactions, so one
        cannot take the others down. A part the database cannot take now (disk full,
        locked, an I/O error) is kept, in order, and retried at the next write; an item it
        can never take (a value SQLite cannot hold) is found by writing that part item by
        item, and is dropped and counted (``rejected``). ``take_notes`` says what happened.
        """
        fresh = [_Part("scalars", rank, list(rows)), _Part("samples", rank, list(samples)),
                 _Part("events", rank, list(events)), _Part("layers", rank, list(layers))]
        parts, self._backlog = self._backlog + [p for p in fresh if p.size], []
        stuck: set[str] = set()
        for part in parts:
            if part.kind in stuck:  # keeps each kind in order behind what still waits
                self._backlog.append(part)
                continue
            try:
                self._write_part(part)
            except sqlite3.OperationalError as exc:
                stuck.add(part.kind)
                self._keep(part, exc)
            except Exception as exc:  # noqa: BLE001 - a bad item: find it, keep the rest
                self._write_each(part, exc, stuck)
        self._trim_backlog()
        self._write_meta()
        if self._behind and not self._backlog and not self._meta:
            self._notes.append("caught up: everything kept for a retry is written")
        self._behind = bool(self._backlog or self._meta)

    def take_notes(self) -> list[str]:
        """What went wrong (or right again) since the last call, one line each, for the journal
        (as ``store`` events: "store: cannot write now (database or disk is full)...")."""
        notes, self._notes = self._notes, []
        return notes

    @property
    def pending(self) -> int:
        """Items kept for a retry."""
        return sum(p.size for p in self._backlog)

    def _write_part(self, part: _Part) -> None:
        """Write one part; on a full disk, draw on the run dir's reserve (a slice at a time) and
        write again while it lasts, so the history is written while any space is left."""
        while True:
            try:
                return self._insert_part(part)
            except sqlite3.OperationalError as exc:
                if not (diskspace.is_full(exc) and self._draw_reserve()):
                    raise

    def _draw_reserve(self) -> bool:
        freed = diskspace.draw_reserve(self.path.parent)
        if freed:
            left = diskspace.reserve_bytes(self.path.parent)
            self.drawn += freed
            log.warning("store: the disk is full; drew %d bytes of the run dir's reserve (%d left)", freed, left)
            if not self._drawing:
                self._drawing = True
                self._notes.append(f"the disk is full: the history is written into the run dir's reserve "
                                   f"({diskspace.fmt_bytes(freed + left)} held back for it)")
        return bool(freed)

    def _insert_part(self, part: _Part) -> None:
        with self._transaction():
            if part.kind == "scalars":
                self._write_scalars(part.rank, part.items)
            elif part.kind == "samples":
                ids = self._name_ids
                insert_many(self._db, "INSERT OR REPLACE INTO samples", 4, [
                    (ids.get(name) or self._name_id(name), part.rank, wall, value)
                    for wall, values in part.items for name, value in values.items()])
            elif part.kind == "events":
                self._db.executemany(
                    "INSERT INTO events (wall, step, kind, message, data, rank) VALUES (?, ?, ?, ?, ?, ?)",
                    [(e.wall, e.step, e.kind, e.message, _json(e.data), e.rank) for e in part.items])
            else:
                self._db.executemany(
                    "INSERT OR REPLACE INTO blobs VALUES (?, ?, ?, ?)",
                    [(msg.type, msg.rank, msg.step, _json(to_dict(msg)).encode()) for msg in part.items])

    def _write_each(self, part: _Part, first: Exception, stuck: set[str]) -> None:
        """Write ``part`` one item a transaction: the bad ones are dropped, the rest stored."""
        bad = 0
        singles = [_Part(part.kind, part.rank, [item]) for item in part.items]
        for single in singles:
            if part.kind in stuck:
                self._backlog.append(single)
                continue
            try:
                self._write_part(single)
            except sqlite3.OperationalError as exc:
                stuck.add(part.kind)
                self._keep(single, exc)
            except Exception:  # noqa: BLE001 - this item can never be stored
                bad += 1
        if bad:
            self.rejected += bad
            self._notes.append(f"refused {bad} {part.kind} item(s) and dropped them: "
                               f"{type(first).__name__}: {str(first)[:120]}")
            log.warning("store: %d %s item(s) refused: %s", bad, part.kind, first)

    def _keep(self, part: _Part, exc: Exception) -> None:
        if not self._behind and diskspace.is_full(exc):
            diskspace.NOTICE.full(self.path.parent, "the metrics store cannot be written: what it cannot take "
                                                    "is kept in memory and written when there is room")
        if not self._behind:
            self._notes.append(f"cannot write now ({exc}); "
                               "what it could not take is kept and retried")
            log.warning("store: cannot write %s now: %s", part.kind, exc)
            self._behind = True
        self._backlog.append(part)

    def _trim_backlog(self) -> None:
        """A store that stays unwritable (a full disk for hours) keeps the newest items only."""
        lost, steps = 0, []
        while self._backlog and self.pending > BACKLOG_ITEMS:
            part = self._backlog.pop(0)
            lost += part.size
            if part.kind == "scalars":
                steps += [row[0] for row in part.items]
        if lost:
            self.lost += lost
            gap = f"; the history has a gap: steps {min(steps)} to {max(steps)}" if steps else ""
            self._notes.append(f"could not be written for too long: {lost} older items were lost{gap}")

    def _write_scalars(self, rank: int, rows: list) -> None:
        ids = self._name_ids
        scalars: list[tuple] = []
        by_series: dict[tuple[int, int], tuple[list, list]] = {}
        """(name id, rank) -> the flush's steps and values, for the summary."""
        # A flush's rows come in runs that hold the same series (a sampled step adds one or
        # two): each run is turned into columns in C, not value by value in Python.
        for names, run in itertools.groupby(rows, key=_series_names):
            run = list(run)
            steps = [row[0] for row in run]
            columns = zip(*map(dict.values, map(_VALUES, run)))
            for name, values in zip(names, columns):
                name_id = ids.get(name) or self._name_id(name)
                scalars += zip(itertools.repeat(name_id), itertools.repeat(rank), steps, values)
                series = by_series.get((name_id, rank))
                if series is None:
                    by_series[(name_id, rank)] = (list(steps), list(values))
                else:
                    series[0].extend(steps)
                    series[1].extend(values)
        if rows:
            # A step's time is that of its first row: a later row of the step (what the script
            # printed at it, printed.py) adds values, not a time.
            insert_many(self._db, "INSERT OR IGNORE INTO steps", 3, [(rank, step, wall) for step, wall, _ in rows])
        if scalars:
            deltas, redo = summary.plan(self._db, self._last, by_series)
            insert_many(self._db, "INSERT OR REPLACE INTO scalars", 4, scalars)
            summary.update(self._db, deltas, redo)

    def set_meta(self, **values) -> None:
        """Store JSON-serialisable metadata under the given keys; never raises: what cannot
        be written now (a full disk) is kept and written with the next flush that can."""
        self._meta.update({k: json.dumps(v, default=str) for k, v in values.items()})
        self._write_meta()

    def _write_meta(self) -> None:
        if not self._meta:
            return
        try:
            while True:
                try:
                    with self._transaction():
                        self._db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", list(self._meta.items()))
                    break
                except sqlite3.OperationalError as exc:
                    if not (diskspace.is_full(exc) and self._draw_reserve()):
                        raise
        except sqlite3.Error as exc:
            if not self._behind:
                self._notes.append(f"cannot write now ({exc}); what it could not take is kept and retried")
                self._behind = True
            return
        self._meta = {}

    @contextmanager
    def _transaction(self):
        self._db.execute("BEGIN")
        try:
            yield
        except BaseException:
            if self._db.in_transaction:  # SQLite rolls some errors back itself (a full disk)
                self._db.execute("ROLLBACK")
            # What is cached of the store may now be ahead of it: the newest steps, and the
            # ids of names inserted by the rolled-back transaction. Look them up again.
            self._last.clear()
            self._name_ids.clear()
            raise
        self._db.execute("COMMIT")

    def close(self) -> None:
        """Write what waits for a retry if it can, checkpoint the WAL into the main file and
        close. Never raises: on a full disk the WAL stays (SQLite reads it back) and what
        could not be written is counted in ``unwritten``."""
        self.unwritten = 0
        if self._backlog or self._meta:
            self.write()
            if self._backlog:
                self.unwritten = self.pending
                steps = [row[0] for p in self._backlog if p.kind == "scalars" for row in p.items]
                gap = f" (steps {min(steps)} to {max(steps)})" if steps else ""
                diskspace.NOTICE.say(f"the metrics store could not be written before the run ended: {self.pending} "
                                     f"items are not in the run's history{gap}")
        try:
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.Error as exc:
            log.warning("store: could not checkpoint the WAL at close: %s", exc)
        finally:
            self._db.close()


def append_event(path: Path | str, event: Event, timeout_s: float = 5.0) -> None:
    """Add one event to a run's store from a process other than the engine (the notifier says
    once that the user's command fails): one short transaction, waiting up to ``timeout_s``
    for the engine's own; a write of the engine's that meets it is kept and retried as any
    locked write is. Raises sqlite3.Error when it cannot."""
    db = sqlite3.connect(path, timeout=timeout_s, isolation_level=None)
    try:
        db.execute("INSERT INTO events (wall, step, kind, message, data, rank) VALUES (?, ?, ?, ?, ?, ?)",
                   (event.wall, event.step, event.kind, event.message, _json(event.data), event.rank))
    finally:
        db.close()


_VALUES = operator.itemgetter(2)


def _series_names(row: list) -> tuple:
    return tuple(row[2])


def _json(value) -> str:
    """Compact JSON that never fails: non-finite numbers are stored as null (see json_safe)."""
    return json.dumps(json_safe(value)[0], separators=(",", ":"), allow_nan=False)
