"""Reading a run's history, live or finished, without ever writing to it.

Damage: a store cut short or with flipped bytes is read up to the damage. The reader
never raises on it once open; it returns what it could read and keeps a one-line
``StoreError`` in ``StoreReader.damage`` (and logs it).

This module opens the store and holds the plain reads (names, ranks, latest values, step
times, events, the per-parameter and schedule records); the series reads decimated for a
chart are ``series_queries.SeriesQueries``, which StoreReader inherits. Stdlib only.
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

from .protocol import Event, LayerNames, Layers, ProtocolError, Schedule
from .series_queries import SeriesQueries, _number
from .store import StoreError
from .wire import from_dict

log = logging.getLogger("ptdash.shared.reader")


class StoreReader(SeriesQueries):
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
            self._samples = "samples" in tables  # stores before it kept host readings by step
            columns = {row[1] for row in self._db.execute("PRAGMA table_info(events)")}
            # Stores written before events knew their rank hold rank 0's only.
            self._event_rank = "rank" if "rank" in columns else "0"
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
        """Every series recorded by step, sorted (not the readings taken by time)."""
        names = self._rows("SELECT id, name FROM names", (), "in its list of names")
        sampled: set = set()
        if self._samples:
            # One key lookup per name in the small samples table; read apart from the
            # names so a damaged page in one costs only that part.
            sampled = set(self._rows("SELECT id FROM names n WHERE EXISTS (SELECT 1 FROM samples WHERE name_id = n.id)",
                                     (), "in its samples", one=True))
        return sorted(n for i, n in names if isinstance(n, str) and i not in sampled)

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

    def sampled_names(self, rank: int = 0) -> list[str]:
        """The series sampled by time (host and GPU readings) that ``rank`` recorded."""
        if not self._samples:
            return []
        return sorted(n for n in self._rows(
            "SELECT name FROM names n WHERE EXISTS (SELECT 1 FROM samples WHERE name_id = n.id AND rank = ?)",
            (rank,), "in its samples", one=True) if isinstance(n, str))

    def latest_samples(self, rank: int = 0) -> dict[str, float | None]:
        """The newest reading of every sampled series of ``rank``."""
        if not self._samples:
            return {}
        rows = self._rows(
            "SELECT n.name, s.value FROM names n JOIN samples s ON s.name_id = n.id AND s.rank = ? "
            "AND s.wall = (SELECT max(wall) FROM samples WHERE name_id = n.id AND rank = ?)",
            (rank, rank), "in its samples")
        return {n: _number(v) for n, v in rows if isinstance(n, str)}

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

    def newest(self, series: list[str], rank: int = 0) -> dict[str, tuple[int, float | None]]:
        """The newest point ``(step, value)`` of each of ``series`` that has one (one key lookup each)."""
        rows = self._rows(
            "SELECT n.name, s.step, s.value FROM names n CROSS JOIN scalars s ON s.name_id = n.id AND s.rank = ? "
            "AND s.step = (SELECT max(step) FROM scalars WHERE name_id = n.id AND rank = ?) "
            f"WHERE n.name IN ({', '.join('?' * len(series))})", (rank, rank, *series), "in its newest points")
        return {n: (step, _number(v)) for n, step, v in rows if isinstance(n, str) and type(step) is int}

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

    def events(self, after_id: int = 0, kind: str | None = None) -> list[Event]:
        """Events newer than ``after_id`` (of one ``kind`` when given), oldest first, with their ids."""
        where, args = "id > ?", (after_id,)
        if kind is not None:
            where, args = "id > ? AND kind = ?", (after_id, kind)
        out = []
        for i, w, s, k, m, d, r in self._rows(
                f"SELECT id, wall, step, kind, message, data, {self._event_rank} FROM events WHERE {where} ORDER BY id",
                args, "in its events"):
            try:
                data = json.loads(d)
            except (TypeError, ValueError) as exc:
                self._damaged(exc, f"in event {i}")
                continue
            if (isinstance(k, str) and isinstance(m, str) and type(s) is int and isinstance(w, (int, float))
                    and isinstance(data, dict) and type(r) is int):
                out.append(Event(kind=k, step=s, wall=float(w), message=m, data=data, rank=r, id=i))
        return out

    def layers(self, rank: int = 0, limit: int | None = None, after_step: int = -1) -> list[Layers]:
        """The stored per-parameter records of ``rank``, oldest first (the newest ``limit``
        when given); records that do not read back as a Layers message are skipped."""
        return [m for m in self._messages("layers", rank, after_step, limit) if isinstance(m, Layers)]

    def layer_names(self, step: int | None = None, rank: int = 0) -> LayerNames | None:
        """The parameter names in effect at ``step`` (default: now), None before any."""
        rows = self._rows(
            "SELECT data FROM blobs WHERE kind = 'layer_names' AND rank = ? AND step <= ? ORDER BY step DESC LIMIT 1",
            (rank, 2 ** 63 - 1 if step is None else step), "in its parameter names", one=True)
        found = [m for m in (self._message(d) for d in rows) if isinstance(m, LayerNames)]
        return found[0] if found else None

    def schedule(self, rank: int = 0) -> Schedule | None:
        """The newest stored schedule ahead (or the note saying why there is none), None before any."""
        found = [m for m in self._messages("schedule", rank, -1, 1) if isinstance(m, Schedule)]
        return found[-1] if found else None

    def _messages(self, kind: str, rank: int, after_step: int, limit: int | None) -> list:
        if limit is None:
            rows = self._rows(
                "SELECT data FROM blobs WHERE kind = ? AND rank = ? AND step > ? ORDER BY step",
                (kind, rank, after_step), f"in its {kind} records", one=True)
        else:
            rows = self._rows(
                "SELECT data FROM blobs WHERE kind = ? AND rank = ? AND step > ? ORDER BY step DESC LIMIT ?",
                (kind, rank, after_step, limit), f"in its {kind} records", one=True)[::-1]
        return [m for m in map(self._message, rows) if m is not None]

    def _message(self, data) -> object | None:
        if not isinstance(data, bytes):
            return None
        try:
            return from_dict(json.loads(data))
        except (ValueError, ProtocolError, RecursionError) as exc:
            self._damaged(exc, "in a per-parameter record")
            return None


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
