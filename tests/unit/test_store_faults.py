"""The store writer loses nothing it can keep: a bad item never takes its flush down with it,
and a store that cannot be written (a full database) keeps what it was given and writes
it once it can. Real SQLite files; a full disk is SQLite's own (``max_page_count``)."""

from __future__ import annotations

import math

from ptdash.shared import store as store_module
from ptdash.shared.protocol import Event, Layers
from ptdash.shared.reader import StoreReader
from ptdash.shared.store import STORE_NAME, StoreWriter


def rows(first: int, last: int) -> list:
    return [[s, 1000.0 + s, {"loss": 1.0 / s, "grad/norm_total": math.inf if s == 3 else 2.0}]
            for s in range(first, last + 1)]


def event(step, message: str = "ok") -> Event:
    return Event(kind="run", step=step, wall=1000.0, message=message, data={"x": math.nan})


def test_a_bad_event_loses_neither_the_rows_nor_the_other_events(tmp_path):
    writer = StoreWriter(tmp_path / STORE_NAME)
    # An event without a step cannot be stored (the column is NOT NULL): only it is dropped.
    writer.write(rows=rows(1, 10), events=[event(1, "first"), event(None, "bad"), event(2, "second")],
                 layers=[Layers(step=10, grad_norms=[1.0, None])])
    assert writer.rejected == 1
    (note,) = writer.take_notes()
    assert note.startswith("refused 1 events item(s) and dropped them: IntegrityError")
    writer.close()
    with StoreReader(tmp_path / STORE_NAME) as reader:
        steps, losses = reader.series("loss")
        assert steps == list(range(1, 11))
        assert [e.message for e in reader.events()] == ["first", "second"]
        assert reader.events()[0].data == {"x": None}
        assert reader.series("grad/norm_total")[1][2] is None  # non-finite reads as None
        assert [layer.step for layer in reader.layers()] == [10]


def test_a_value_sqlite_cannot_hold_drops_only_its_row(tmp_path):
    writer = StoreWriter(tmp_path / STORE_NAME)
    bad = rows(1, 6)
    bad[3][2]["loss"] = 2 ** 70  # beyond SQLite's 64-bit integers
    writer.write(rows=bad, events=[event(1)])
    assert writer.rejected == 1 and "OverflowError" in writer.take_notes()[0]
    writer.close()
    with StoreReader(tmp_path / STORE_NAME) as reader:
        assert reader.series("loss")[0] == [1, 2, 3, 5, 6]
        assert len(reader.events()) == 1


def test_a_full_store_keeps_everything_and_writes_it_when_it_can(tmp_path):
    writer = StoreWriter(tmp_path / STORE_NAME)
    writer.write(rows=rows(1, 5))
    (pages,) = writer._db.execute("PRAGMA page_count").fetchone()
    writer._db.execute(f"PRAGMA max_page_count = {pages}")  # the disk is full from here on
    wide = [[s, 1000.0 + s, {f"m{i}": float(i) for i in range(200)}] for s in range(6, 400)]
    writer.write(rows=wide, events=[event(6, "while full")])
    assert writer.pending >= len(wide) and writer.rejected == 0
    (note,) = writer.take_notes()
    assert note.startswith("cannot write now (database or disk is full)")
    writer.write(rows=rows(400, 405), events=[event(400, "still full")])  # queued behind, in order
    assert writer.pending >= len(wide) + 6 and writer.take_notes() == []
    writer._db.execute("PRAGMA max_page_count = 1073741823")  # space again
    writer.write(events=[event(406, "space again")])
    assert writer.pending == 0
    assert writer.take_notes() == ["caught up: everything kept for a retry is written"]
    writer.close()
    with StoreReader(tmp_path / STORE_NAME) as reader:
        assert reader.series("loss")[0] == [1, 2, 3, 4, 5, *range(400, 406)]
        assert reader.series("m7")[0] == list(range(6, 400))
        assert [e.message for e in reader.events()] == ["while full", "still full", "space again"]


def test_a_store_full_for_too_long_keeps_the_newest_items(tmp_path, monkeypatch):
    monkeypatch.setattr(store_module, "BACKLOG_ITEMS", 50)
    writer = StoreWriter(tmp_path / STORE_NAME)
    writer.write(rows=rows(1, 2))
    (pages,) = writer._db.execute("PRAGMA page_count").fetchone()
    writer._db.execute(f"PRAGMA max_page_count = {pages}")
    for first in range(3, 300, 20):
        writer.write(rows=[[s, 0.0, {f"m{i}": 1.0 for i in range(100)}] for s in range(first, first + 20)])
    assert writer.pending <= 50 and writer.lost > 0
    assert any("older items were lost" in note for note in writer.take_notes())
    writer._db.execute("PRAGMA max_page_count = 1073741823")
    writer.close()  # writes what it kept
    with StoreReader(tmp_path / STORE_NAME) as reader:
        steps = reader.series("m1")[0]
    assert steps and steps[-1] == 302 and len(steps) == 300 - writer.lost  # steps 3..302, the newest kept


def test_lost_items_name_the_gap_in_the_history(tmp_path, monkeypatch):
    monkeypatch.setattr(store_module, "BACKLOG_ITEMS", 50)
    writer = StoreWriter(tmp_path / STORE_NAME)
    writer.write(rows=rows(1, 2))
    (pages,) = writer._db.execute("PRAGMA page_count").fetchone()
    writer._db.execute(f"PRAGMA max_page_count = {pages}")
    for first in range(3, 100, 20):
        writer.write(rows=[[s, 0.0, {f"m{i}": 1.0 for i in range(100)}] for s in range(first, first + 20)])
    notes = [n for n in writer.take_notes() if "older items were lost" in n]
    assert notes and notes[0].endswith("; the history has a gap: steps 3 to 22"), notes
    writer._db.execute("PRAGMA max_page_count = 1073741823")
    writer.close()


def test_metadata_and_closing_never_raise_on_a_full_store(tmp_path, monkeypatch):
    from ptdash.shared import diskspace

    said = []
    monkeypatch.setattr(diskspace, "NOTICE", diskspace.Notice())
    diskspace.NOTICE.sinks.append(said.append)
    writer = StoreWriter(tmp_path / STORE_NAME)
    writer.write(rows=rows(1, 2))
    (pages,) = writer._db.execute("PRAGMA page_count").fetchone()
    writer._db.execute(f"PRAGMA max_page_count = {pages}")
    writer.set_meta(config={"x": "y" * 20000})  # kept, not raised
    writer.write(rows=[[s, 0.0, {f"m{i}": 1.0 for i in range(100)}] for s in range(3, 40)])
    writer.close()  # cannot write what it kept: says so, does not raise
    assert writer.unwritten > 0
    assert any(m.startswith("the metrics store could not be written before the run ended") and "steps 3 to 39" in m
               for m in said), said
    with StoreReader(tmp_path / STORE_NAME) as reader:
        assert reader.series("loss")[0] == [1, 2]


def test_metadata_kept_while_full_is_written_when_there_is_room(tmp_path):
    writer = StoreWriter(tmp_path / STORE_NAME)
    (pages,) = writer._db.execute("PRAGMA page_count").fetchone()
    writer._db.execute(f"PRAGMA max_page_count = {pages}")
    writer.set_meta(config={"x": "y" * 20000})
    writer._db.execute("PRAGMA max_page_count = 1073741823")
    writer.write(rows=rows(1, 2))
    writer.close()
    with StoreReader(tmp_path / STORE_NAME) as reader:
        assert reader.meta()["config"] == {"x": "y" * 20000}
