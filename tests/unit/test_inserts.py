"""Many rows per INSERT (engine/shared/inserts.py) does what executemany does."""

from __future__ import annotations

import sqlite3

import pytest

from ptdash.shared.inserts import MAX_VARIABLES, insert_many


@pytest.mark.parametrize("n", [0, 1, 7, 128, 129, 300, 1000])
def test_every_row_is_inserted_and_a_later_row_replaces_an_earlier_one(n):
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, a REAL, b TEXT, c INTEGER)")
    rows = [(i % max(1, n // 2 + 1), float(i), f"row {i}", None if i % 3 else i) for i in range(n)]
    insert_many(db, "INSERT OR REPLACE INTO t", 4, rows)
    want = {}
    for k, a, b, c in rows:  # executemany's order: the last row of a key wins
        want[k] = (k, a, b, c)
    assert db.execute("SELECT * FROM t ORDER BY k").fetchall() == sorted(want.values())


def test_a_statement_never_holds_more_parameters_than_old_sqlite_allows():
    seen = []
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE t (a, b, c, d, e, f, g, h)")
    db.set_trace_callback(seen.append)
    insert_many(db, "INSERT INTO t", 8, [tuple(range(8))] * 1000)
    assert db.execute("SELECT count(*) FROM t").fetchone() == (1000,)
    counts = [s.count("(") for s in seen if s.startswith("INSERT")]  # rows per statement
    assert sum(counts) == 1000 and max(counts) * 8 <= MAX_VARIABLES <= 999
    assert len(counts) <= 1000 // 64 + 7  # full statements, then at most one of each smaller power of two


def test_a_conflict_clause_follows_the_rows():
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, n INTEGER)")
    insert_many(db, "INSERT INTO t", 2, [(1, 1), (2, 1)])
    insert_many(db, "INSERT INTO t", 2, [(1, 5), (3, 1)], "ON CONFLICT (k) DO UPDATE SET n = n + excluded.n")
    assert db.execute("SELECT * FROM t ORDER BY k").fetchall() == [(1, 6), (2, 1), (3, 1)]
