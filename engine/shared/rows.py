"""A run's history as rows, one per step, read in windows of steps; and a series' extremes.

``RowReader`` is a ``StoreReader`` with the reads that exports and summaries need:

- ``columns`` names every series a row can hold: each rank's scalars and, when asked,
  each parameter's gradient norm and update ratio;
- ``rows`` yields ``(step, wall, values)`` in step order, reading one window of steps at
  a time through the primary keys, so memory stays bounded however long the run is;
- ``stats`` gives a series' first, last, lowest and highest points from the summary
  table (a few hundred rows for a million steps), without reading the series;
- ``clock`` gives the wall time at steps spread over the run, to place any step in time.

Like the StoreReader, it never raises on a damaged store once open: it stops where the
damage is and keeps it in ``damage``. Stdlib only.
"""

from __future__ import annotations

import bisect
import sqlite3
from collections.abc import Iterator
from typing import NamedTuple

from . import names
from .protocol import LayerNames, Layers
from .reader import StoreReader
from .series_queries import _number
from .summary import LEVELS

WINDOW = 4096
"""Steps read per window by ``rows``."""

LAYER_FIELDS = ("grad_norm", "update_ratio")


class Column(NamedTuple):
    """One column of the rows: ``label`` is its header (``loss``, ``rank1/loss``, ``layer/fc.weight/grad_norm``)."""

    label: str
    rank: int
    series: str
    """The scalar series' name, or the parameter's name for a layer column."""
    field: str | None = None
    """None for a scalar series; one of LAYER_FIELDS for a parameter's."""


class Point(NamedTuple):
    """One point of a series (value None where it was not finite)."""

    step: int
    value: float | None


class Stats(NamedTuple):
    """A series' first and last points and its extremes (None values never win)."""

    first: Point
    last: Point
    low: Point | None
    high: Point | None


class RowReader(StoreReader):
    """A StoreReader that also streams rows and summarises series (see the module docstring)."""

    def columns(self, layers: bool = False) -> list[Column]:
        """Every series that holds a row, rank by rank; with ``layers``, each parameter's too."""
        ids = self._name_ids()
        out = []
        for rank in self.ranks():
            for name in sorted(ids):
                found = self._rows("SELECT EXISTS (SELECT 1 FROM scalars WHERE name_id = ? AND rank = ?)",
                                   (ids[name], rank), "in its scalars", one=True)
                if found and found[0]:
                    out.append(Column(names.ranked(rank, name), rank, name))
        if layers:
            for rank in self._layer_ranks():
                seen: set[str] = set()
                for message in self._layer_names(rank):
                    for name in message.names:
                        if isinstance(name, str) and name not in seen:
                            seen.add(name)
                            out += [Column(names.ranked(rank, names.layer(name, f)), rank, name, f)
                                    for f in LAYER_FIELDS]
        return out

    def rows(self, columns: list[Column], window: int = WINDOW,
             last_step: int | None = None) -> Iterator[tuple[int, float | None, list[float | None]]]:
        """``(step, wall, values)`` of every step holding a value of ``columns``, in step order.

        ``values`` follow ``columns`` (None where a step has none); ``wall`` is rank 0's
        time of the step (another rank's when rank 0 has none). Reads ``window`` steps
        at a time, each window in one read transaction; ``last_step`` ends the rows (an
        export of a live run stops where it began).
        """
        ids = self._name_ids()
        scalars = [(i, ids[c.series], c.rank) for i, c in enumerate(columns) if c.field is None and c.series in ids]
        layered = {c.rank for c in columns if c.field is not None}
        where = {(c.rank, c.series, c.field): i for i, c in enumerate(columns) if c.field is not None}
        names = {rank: self._layer_names(rank) for rank in layered}
        ranks = self.ranks()
        # Past damage the windows go on by step count up to the newest step the store
        # knows: a damaged page costs its own steps, not the rest of the run.
        newest = max((s for s in map(self.last_step, ranks) if s is not None), default=None)
        bound = newest if last_step is None else min(last_step, newest if newest is not None else last_step)
        start = self._next_step(scalars, layered, None)
        while start is not None and (bound is None or start <= bound):
            end = start + window - 1 if bound is None else min(start + window - 1, bound)
            table: dict[int, list[float | None]] = {}
            walls: dict[int, float] = {}
            try:
                with self._snapshot():
                    for i, name_id, rank in scalars:
                        for step, value in self._salvaged(
                                "SELECT step, value FROM scalars WHERE name_id = ? AND rank = ? AND step BETWEEN ? AND ?",
                                (name_id, rank), start, end, "in its scalars"):
                            row = table.get(step) or table.setdefault(step, [None] * len(columns))
                            row[i] = _number(value)
                    for rank in layered:
                        self._fill_layers(rank, names[rank], where, start, end, table, len(columns))
                    for rank in reversed(ranks):  # rank 0's wall wins
                        walls.update(self._salvaged("SELECT step, wall FROM steps WHERE rank = ? AND step BETWEEN ? AND ?",
                                                    (rank,), start, end, "in its step times"))
            except sqlite3.DatabaseError as exc:  # the per-parameter records: their window is skipped
                self._damaged(exc, f"in steps {start}-{end}")
            for step in sorted(table):
                if type(step) is int:
                    yield step, _number(walls.get(step)), table[step]
            damage = self.damage
            start = self._next_step(scalars, layered, end)
            if bound is not None and (self.damage is not damage or (start is None and self.damage is not None)):
                start = end + 1  # where the next step is could not be read: the next window

    unread: tuple[int, int, int] | None = None
    """After ``rows`` met damage: ``(values, first_step, last_step)``, the values left out
    because their pages are damaged and the steps they span; None while nothing was."""
    SALVAGE_PROBES = 50_000
    """Failed reads a damaged store's ``rows`` may spend finding what is whole around damaged pages."""
    _probes = 0

    def _salvaged(self, sql: str, key: tuple, lo: int, hi: int, what: str) -> list:
        """The rows of ``sql`` over steps ``lo..hi``; past a damaged page the range is split
        and read in parts, so only the steps on the damaged pages are left out."""
        got: list = []
        try:
            for row in self._db.execute(sql, (*key, lo, hi)):
                got.append(row)
            return got
        except sqlite3.DatabaseError as exc:
            self._probes += 1
            failed = exc
        first = got[-1][0] + 1 if got and type(got[-1][0]) is int else lo
        if first > hi:
            return got
        if first == hi or self._probes > self.SALVAGE_PROBES:
            self._damaged(failed, f"{what} at step {first}" if first == hi else f"{what} in steps {first}-{hi}")
            values, low, high = self.unread or (0, first, hi)
            self.unread = (values + hi - first + 1, min(low, first), max(high, hi))
            return got
        mid = (first + hi) // 2
        return got + self._salvaged(sql, key, first, mid, what) + self._salvaged(sql, key, mid + 1, hi, what)

    def stats(self, name: str, rank: int = 0) -> Stats | None:
        """The first, last, lowest and highest points of series ``name``; None when it has none."""
        name_id = self._name_ids().get(name)
        if name_id is None:
            return None
        key = "name_id = ? AND rank = ?"
        try:
            with self._snapshot():
                ends = [self._db.execute(f"SELECT step, value FROM scalars WHERE {key} ORDER BY step {order} LIMIT 1",
                                         (name_id, rank)).fetchone() for order in ("ASC", "DESC")]
                if ends[0] is None:
                    return None
                # SQLite returns the bare step column from the row holding the min (max); the
                # coarsest summary level holds every extreme in a few hundred rows per million steps.
                if self._summary:
                    low, high = (self._db.execute(
                        f"SELECT {side}_step, {agg}({side}) FROM summary WHERE level = ? AND {key}",
                        (LEVELS[-1], name_id, rank)).fetchone() for side, agg in (("lo", "min"), ("hi", "max")))
                else:
                    low, high = (self._db.execute(f"SELECT step, {agg}(value) FROM scalars WHERE {key}",
                                                  (name_id, rank)).fetchone() for agg in ("min", "max"))
        except sqlite3.DatabaseError as exc:
            self._damaged(exc, f"in the series {name!r}")
            return None
        first, last = (Point(s, _number(v)) for s, v in ends)
        low, high = (Point(s, _number(v)) if v is not None else None for s, v in (low, high))
        return Stats(first, last, low, high)

    def wall_range(self, rank: int = 0) -> tuple[tuple[int, float] | None, tuple[int, float] | None]:
        """``(step, wall)`` of the first and the last recorded step of ``rank`` (None when none)."""
        out = []
        for order in ("ASC", "DESC"):
            found = self._rows(f"SELECT step, wall FROM steps WHERE rank = ? ORDER BY step {order} LIMIT 1", (rank,),
                               "in its steps")
            out.append((found[0][0], float(found[0][1])) if found and _number(found[0][1]) is not None else None)
        return out[0], out[1]

    def clock(self, points: int, rank: int = 0) -> tuple[list[int], list[float]]:
        """``(steps, walls)`` at about ``points`` steps spread evenly over the run, its first
        and last included: enough to place any step in time without reading every wall."""
        first, last = self.wall_range(rank)
        if first is None or last is None:
            return [], []
        found = {first[0]: first[1], last[0]: last[1]}
        span = last[0] - first[0]
        for i in range(1, max(1, points - 1)):
            rows = self._rows("SELECT step, wall FROM steps WHERE rank = ? AND step >= ? ORDER BY step LIMIT 1",
                              (rank, first[0] + span * i // (points - 1)), "in its steps")
            if rows and type(rows[0][0]) is int and _number(rows[0][1]) is not None:
                found[rows[0][0]] = float(rows[0][1])
        steps = sorted(found)
        return steps, [found[s] for s in steps]

    def kept(self, rank: int = 0) -> dict[str, int] | None:
        """How many steps of ``rank`` the store kept each thing at: ``steps`` (every recorded
        step), ``norm`` (a total gradient norm), ``layers`` (per-layer norms) and ``ratios``
        (update ratios); None for a store it cannot count."""
        norm_id = self._name_ids().get(names.GRAD_NORM, -1)
        found = self._rows(
            "SELECT (SELECT count(*) FROM steps WHERE rank = ?), "
            "(SELECT count(*) FROM scalars WHERE name_id = ? AND rank = ?), "
            "(SELECT count(*) FROM blobs WHERE kind = 'layers' AND rank = ?), "
            # The store writes compact JSON (store._json) in field order: a record without
            # ratios holds this text, one with them a list in its place.
            "(SELECT count(*) FROM blobs WHERE kind = 'layers' AND rank = ? AND "
            "instr(data, CAST('\"update_ratios\":null' AS BLOB)) = 0)",
            (rank, norm_id, rank, rank, rank), "in its counts")
        if not found or not all(type(v) is int for v in found[0]):
            return None
        return dict(zip(("steps", "norm", "layers", "ratios"), found[0]))

    def _name_ids(self) -> dict[str, int]:
        return {n: i for i, n in self._rows("SELECT id, name FROM names", (), "in its list of names")
                if isinstance(n, str)}

    def _layer_ranks(self) -> list[int]:
        return [r for r in self.ranks() if self._layer_names(r)]

    def _layer_names(self, rank: int) -> list[LayerNames]:
        """Every parameter list ``rank`` recorded, oldest first (a few: one per change)."""
        rows = self._rows("SELECT data FROM blobs WHERE kind = 'layer_names' AND rank = ? ORDER BY step", (rank,),
                          "in its parameter names", one=True)
        return [m for m in map(self._message, rows) if isinstance(m, LayerNames)]

    def _fill_layers(self, rank: int, names: list[LayerNames], where: dict, start: int, end: int,
                     table: dict[int, list], width: int) -> None:
        """Put the per-parameter records of ``rank`` in ``[start, end]`` into ``table``'s rows."""
        firsts = [n.step for n in names]
        for data in self._db.execute("SELECT data FROM blobs WHERE kind = 'layers' AND rank = ? AND step BETWEEN ? AND ?",
                                     (rank, start, end)):
            record = self._message(data[0])
            at = bisect.bisect_right(firsts, record.step) - 1 if isinstance(record, Layers) else -1
            if at < 0:
                continue
            row = table.get(record.step) or table.setdefault(record.step, [None] * width)
            for field, values in (("grad_norm", record.grad_norms), ("update_ratio", record.update_ratios or [])):
                for name, value in zip(names[at].names, values):
                    i = where.get((rank, name, field))
                    if i is not None:
                        row[i] = _number(value)

    def _next_step(self, scalars: list, layered: set[int], after: int | None) -> int | None:
        """The first step after ``after`` (None: the first of all) holding a value of the columns."""
        after = -(2 ** 63) if after is None else after
        found = []
        for _, name_id, rank in scalars:
            found += self._rows("SELECT min(step) FROM scalars WHERE name_id = ? AND rank = ? AND step > ?",
                                (name_id, rank, after), "in its scalars", one=True)
        for rank in layered:
            found += self._rows("SELECT min(step) FROM blobs WHERE kind = 'layers' AND rank = ? AND step > ?",
                                (rank, after), "in its per-parameter records", one=True)
        steps = [s for s in found if type(s) is int]
        return min(steps) if steps else None
