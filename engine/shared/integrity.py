"""Is a run's store whole? A check cheap enough for ``show --once`` and ``doctor``.

Reads that go around a damaged page never see it: a summary drawn from the summary
table and the newest rows looks healthy over a store whose middle is gone. SQLite's
``PRAGMA quick_check`` reads every page once (about 120 MB/s on the 2-core test box, so
0.1 s for a 60,000-step store of 13 MB) without the index cross-checks of
``integrity_check``. When it finds damage, the rows are read as ``ptdash export``
reads them, so the damage is named as the export will meet it: the table, the first
step and what is left out. Stdlib only.
"""

from __future__ import annotations

import re
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from .rows import RowReader
from .store import StoreError

SHOW_LIMIT_BYTES = 256 * 1024 * 1024
"""``show --once`` checks stores up to this size (about 2 s here); ``doctor`` checks any."""


@dataclass(frozen=True)
class Integrity:
    """What checking a store found."""

    damage: str | None
    """One line naming the damage, as ``export`` meets it; None when the store is whole or unchecked."""
    checked: bool
    """False: too big for this check (``skipped`` says so); ``damage`` is then None."""
    seconds: float = 0.0
    skipped: str = ""


def check(path: Path | str, limit_bytes: int | None = None) -> Integrity:
    """Check the store at ``path`` (of at most ``limit_bytes``, when given)."""
    path = Path(path)
    t0 = time.perf_counter()
    try:
        size = path.stat().st_size
    except OSError as exc:
        return Integrity(damage=f"{path.name} is unreadable: {exc.strerror or exc}", checked=True)
    if limit_bytes is not None and size > limit_bytes:
        return Integrity(damage=None, checked=False,
                         skipped=f"not checked ({size / 1e6:.0f} MB; ptdash doctor checks it)")
    try:
        reader = RowReader(path)
    except StoreError as exc:
        return Integrity(damage=str(exc), checked=True, seconds=time.perf_counter() - t0)
    with reader:
        found = _quick_check(reader)
        if found is None and reader.damage is None:
            return Integrity(damage=None, checked=True, seconds=time.perf_counter() - t0)
        if reader.damage is None:
            for _ in reader.rows(reader.columns(layers=True)):
                pass
        damage = str(reader.damage) if reader.damage is not None else f"{path.name} is damaged {found}"
        if reader.unread is not None:
            values, first, last = reader.unread
            damage += (f"; {values:,} step(s) of series between steps {first:,} and {last:,} are on damaged "
                       "pages (ptdash export writes everything else)")
        elif reader.damage is None:
            damage += " (its rows read whole: ptdash export writes all of them)"
        return Integrity(damage=damage, checked=True, seconds=time.perf_counter() - t0)


_TREE = re.compile(r"Tree (\d+) page")


def _quick_check(reader: RowReader) -> str | None:
    """``quick_check``'s first complaint as ``in its <table> (...)``; None when it says ok."""
    db = reader._db
    try:
        rows = [r[0] for r in db.execute("PRAGMA quick_check(3)")]
    except sqlite3.DatabaseError as exc:
        return f"({str(exc).splitlines()[0] if str(exc).strip() else type(exc).__name__})"
    if rows == ["ok"]:
        return None
    text = next((r for r in rows if isinstance(r, str) and not r.startswith("***")), str(rows[0]))
    tree = _TREE.search(text)
    table = None
    if tree:
        try:
            found = db.execute("SELECT name FROM sqlite_master WHERE rootpage = ?", (int(tree.group(1)),)).fetchone()
            table = found[0] if found else None
        except sqlite3.DatabaseError:
            table = None
    return (f"in its {table} table" if table else "") + f" (SQLite's quick_check: {text.strip()[:160]})"
