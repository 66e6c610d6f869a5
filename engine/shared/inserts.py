"""Many rows per ``INSERT``: what ``executemany`` does, in a few statements.

``executemany`` runs its statement once per row, and the sqlite3 module lets go of the GIL
around every run. With another thread wanting the GIL (the training thread, between its
kernels) every row then costs two hand-overs: measured on the 2-core CI machine, 36 µs a
step against 10 for the same rows in statements of many rows, which hand over once each.
A statement holds at most MAX_VARIABLES parameters (SQLite before 3.32 allows 999) and a
power-of-two number of rows, so each table needs only a few prepared statements (the
sqlite3 module keeps them). Stdlib only.
"""

from __future__ import annotations

import itertools
import sqlite3

MAX_VARIABLES = 512

_STATEMENTS: dict[tuple[str, int, int, str], str] = {}


def insert_many(db: sqlite3.Connection, head: str, width: int, rows: list, tail: str = "") -> None:
    """``db.executemany(f"{head} VALUES (?, ...) {tail}", rows)`` for rows of ``width`` values,
    rows taking effect in order (a later row replaces an earlier one it conflicts with)."""
    most = 1
    while most * 2 * width <= MAX_VARIABLES:
        most *= 2
    start, n = 0, len(rows)
    while start < n:
        k = most
        while k > n - start:
            k //= 2
        key = (head, width, k, tail)
        sql = _STATEMENTS.get(key)
        if sql is None:
            one = "(" + ", ".join("?" * width) + ")"
            sql = _STATEMENTS[key] = f"{head} VALUES {', '.join([one] * k)} {tail}"
        db.execute(sql, list(itertools.chain.from_iterable(rows[start:start + k])))
        start += k
