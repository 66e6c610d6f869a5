"""The metrics store: summary-based decimation, reads during writes, damaged files.

Real SQLite files, a real writer process; no mocks.
"""

from __future__ import annotations

import math
import random
import shutil
import sqlite3
from pathlib import Path

import pytest

from ptdash.shared.decimate import merge_point
from ptdash.shared.protocol import Event, Layers, Schedule
from ptdash.shared.reader import StoreReader
from ptdash.shared.store import StoreError, StoreWriter
from ptdash.shared.summary import LEVELS

STORE = "metrics.db"


def value_at(step: int, name: str = "loss") -> float | None:
    """A deterministic series with spikes and gaps, so a read can be checked point by point."""
    if step % 997 == 0:
        return None  # a non-finite value, stored as NULL
    base = math.sin(step / 300.0) + (hash(name) % 7) / 10
    if step % 7919 == 0:
        return base + 50.0  # a spike the decimation must keep
    if step % 6007 == 0:
        return base - 50.0
    return base


NAMES = ("loss", "grad/norm_total", "opt/lr/group0")


def write_steps(writer: StoreWriter, first: int, last: int, flush: int = 250, rank: int = 0) -> None:
    for start in range(first, last + 1, flush):
        rows = [[s, 1000.0 + s, {n: value_at(s, n) for n in NAMES}] for s in range(start, min(last, start + flush - 1) + 1)]
        writer.write(rows=rows, rank=rank)


def raw_points(path: Path, name: str, rank: int = 0) -> dict[int, float | None]:
    db = sqlite3.connect(path)
    try:
        return dict(db.execute(
            "SELECT step, value FROM scalars JOIN names ON id = name_id WHERE name = ? AND rank = ?", (name, rank)))
    finally:
        db.close()


def assert_summary_exact(path: Path) -> None:
    """Every summary bucket equals the min/max recomputed from the raw rows."""
    db = sqlite3.connect(path)
    try:
        expected: dict[tuple, list] = {}
        for name_id, rank, step, value in db.execute("SELECT name_id, rank, step, value FROM scalars ORDER BY step"):
            for level in LEVELS:
                key = (level, name_id, rank, step // level)
                expected[key] = merge_point(expected.get(key), step, value)
        stored = {tuple(r[:4]): list(r[4:]) for r in db.execute("SELECT * FROM summary")}
    finally:
        db.close()
    assert stored.keys() == expected.keys()
    for key, bucket in expected.items():
        got = stored[key]
        # Ties may name another step with the same value; the values must match exactly.
        assert (got[1], got[3]) == (bucket[1], bucket[3]), key
        if bucket[1] is None:
            assert got[0] == bucket[0], key


# ------------------------------------------------------------------------ decimation


@pytest.fixture(scope="module")
def long_store(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("long") / STORE
    writer = StoreWriter(path)
    write_steps(writer, 1, 60_000)
    writer.close()
    return path


def test_summary_matches_the_raw_rows(long_store):
    assert_summary_exact(long_store)


@pytest.mark.parametrize("after", [None, 12_345, 40_000, 59_000])
def test_decimated_read_keeps_real_points_and_every_extreme(long_store, after):
    raw = raw_points(long_store, "loss")
    in_range = {s: v for s, v in raw.items() if after is None or s > after}
    with StoreReader(long_store) as reader:
        steps, values = reader.series("loss", max_points=4000, after_step=after)
        assert reader.damage is None
    assert steps == sorted(set(steps)) and len(steps) <= 4000
    assert all(s in in_range and in_range[s] == v for s, v in zip(steps, values))
    finite = {s: v for s, v in in_range.items() if v is not None}
    assert max(finite.values()) in values and min(finite.values()) in values  # spikes survive
    assert steps[0] == min(in_range) and steps[-1] == max(in_range)  # the whole range is covered
    if len(in_range) > 4000:
        assert len(steps) > 1000  # decimated, not starved
        gaps = [b - a for a, b in zip(steps, steps[1:])]
        assert max(gaps) <= 2 * math.ceil(len(in_range) / 2000) + LEVELS[-1] // 4


def test_short_ranges_are_read_exactly(long_store):
    raw = raw_points(long_store, "grad/norm_total")
    with StoreReader(long_store) as reader:
        steps, values = reader.series("grad/norm_total", max_points=4000, after_step=57_000)
        all_steps, all_values = reader.series("grad/norm_total")
    assert steps == list(range(57_001, 60_001))
    assert values == [raw[s] for s in steps]
    assert len(all_steps) == 60_000 and all_values == [raw[s] for s in all_steps]


def test_summary_stays_exact_through_rewrites_gaps_and_ranks(tmp_path):
    path = tmp_path / STORE
    writer = StoreWriter(path)
    write_steps(writer, 1, 5000, flush=333)
    write_steps(writer, 1, 700, flush=100, rank=1)
    # System samples taken while paused: the same step written again, first lowering the
    # bucket's minimum, then taking that minimum away again.
    for value in (-100.0, 5.0, None, 7.0):
        writer.write(rows=[[5000, 0.0, {"host/cpu_pct": value, "loss": value}]])
    # Steps written out of order, and twice inside one flush.
    writer.write(rows=[[7000, 0.0, {"loss": 1.0}], [6000, 0.0, {"loss": -9.0}], [6000, 0.0, {"loss": 2.0}]])
    writer.close()
    assert_summary_exact(path)
    # A second writer (the launcher recording a crash) continues the same store.
    writer = StoreWriter(path)
    writer.write(rows=[[6500, 0.0, {"loss": 99.0}]])
    write_steps(writer, 7001, 9000)
    writer.close()
    assert_summary_exact(path)
    with StoreReader(path) as reader:
        steps, values = reader.series("loss", max_points=100)
        raw = [v for v in raw_points(path, "loss").values() if v is not None]
        assert max(raw) == 99.0 and 99.0 in values and min(raw) in values
        assert reader.series("loss", rank=1, max_points=100)[0][-1] == 700
        assert reader.ranks() == [0, 1] and reader.last_step(1) == 700


@pytest.mark.parametrize("seed", range(6))
def test_summary_names_the_earliest_extreme_whatever_the_flushes_hold(tmp_path, seed):
    """Flushes shaped like the engine's (a series on sampled steps only, so the rows change
    their set of series; values that tie; None; a step written again, out of order or twice
    in one flush) keep every bucket's extremes and the first step that reached each."""
    rng = random.Random(seed)
    path = tmp_path / STORE
    writer = StoreWriter(path)
    step = 0
    for _ in range(60):
        rows = []
        for _ in range(rng.randint(1, 90)):
            step += rng.choice((1, 1, 1, 1, 2, 17))
            at = step if rng.random() > 0.03 else rng.randint(max(1, step - 40), step)  # a rewrite
            values = {"loss": rng.choice((0.5, 0.25, 1.0, -1.0, rng.random()))}
            if rng.random() < 0.2:
                values["grad/norm_total"] = rng.choice((None, 2.0, 3.0))
            if rng.random() < 0.02:
                values["loss"] = None
            values["opt/lr/group0"] = 1e-3
            rows.append([at, 0.0, values])
        writer.write(rows=rows)
    writer.close()
    assert_summary_exact(path)
    db = sqlite3.connect(path)
    try:
        points: dict[tuple, list] = {}
        for name_id, step, value in db.execute("SELECT name_id, step, value FROM scalars ORDER BY name_id, step"):
            for level in LEVELS:
                points.setdefault((level, name_id, step // level), []).append((step, value))
        for level, name_id, bucket, lo_step, lo, hi_step, hi in db.execute(
                "SELECT level, name_id, bucket, lo_step, lo, hi_step, hi FROM summary"):
            finite = [(s, v) for s, v in points[(level, name_id, bucket)] if v is not None]
            if finite:
                assert lo_step == min(s for s, v in finite if v == lo), (level, name_id, bucket)
                assert hi_step == min(s for s, v in finite if v == hi), (level, name_id, bucket)
    finally:
        db.close()


def test_a_store_without_the_summary_table_is_still_decimated(tmp_path):
    path = tmp_path / STORE
    writer = StoreWriter(path)
    write_steps(writer, 1, 20_000)
    writer.close()
    db = sqlite3.connect(path)
    db.execute("DROP TABLE summary")
    db.commit()
    db.close()
    raw = raw_points(path, "loss")
    with StoreReader(path) as reader:
        steps, values = reader.series("loss", max_points=4000)
    assert 1000 < len(steps) <= 4000 and all(raw[s] == v for s, v in zip(steps, values))
    # A later writer (the launcher recording a crash) creates the table empty: still raw.
    writer = StoreWriter(path)
    writer.write(events=[Event(kind="run", step=20_000, wall=0.0, message="crashed")])
    writer.close()
    with StoreReader(path) as reader:
        assert reader.series("loss", max_points=4000) == (steps, values)


# ------------------------------------------------------------------- reads during writes







# -------------------------------------------------------------------------- damaged files


@pytest.fixture(scope="module")
def real_store(tmp_path_factory) -> tuple[Path, dict]:
    """A closed store like the engine leaves: scalars, step times, events, blobs, metadata."""
    path = tmp_path_factory.mktemp("real") / STORE
    writer = StoreWriter(path)
    writer.set_meta(config={"clip": 1.0}, run={"id": "abc"})
    rng = random.Random(3)
    for start in range(1, 6001, 200):
        rows = [[s, 1000.0 + s, {n: value_at(s, n) for n in NAMES}] for s in range(start, start + 200)]
        samples = [[1000.0 + start + 199, {"host/cpu_pct": rng.random() * 100}]]
        layers = [Layers(step=start + 199, grad_norms=[rng.random() for _ in range(40)])]
        events = [Event(kind="run", step=start, wall=1000.0 + start, message=f"at {start}", data={"step": start})]
        writer.write(rows=rows, samples=samples, layers=layers, events=events)
    writer.close()
    return path, {n: raw_points(path, n) for n in NAMES}


def read_everything(path: Path) -> tuple[StoreReader | None, dict]:
    """Every read the dashboard and ``ptdash ls`` make; only StoreError may escape, at open."""
    try:
        reader = StoreReader(path)
    except StoreError as exc:
        assert len(str(exc).splitlines()) == 1
        return None, {}
    with reader:
        got = {"names": reader.names(), "meta": reader.meta(), "events": reader.events(),
               "walls": reader.walls(), "latest": reader.latest(), "ranks": reader.ranks(),
               "layers": reader.layers(), "names@": reader.layer_names(), "last": reader.last_step(),
               "sampled": reader.sampled("host/cpu_pct"), "sampled@5": reader.sampled("host/cpu_pct", max_points=5),
               "latest samples": reader.latest_samples()}
        for name in reader.names():
            got[name] = reader.series(name)
            got[name + "@4000"] = reader.series(name, max_points=4000)
            got[name + "@100"] = reader.series(name, max_points=100, after_step=2500)
        for key, value in got.items():
            if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], list) and "sampled" not in key:
                steps, values = value
                assert all(type(s) is int for s in steps), key
                assert all(v is None or (type(v) is float and math.isfinite(v)) for v in values), key
        if reader.damage is not None:
            assert len(str(reader.damage).splitlines()) == 1 and "damaged" in str(reader.damage)
            with pytest.raises(StoreError):
                reader.check()
        return reader, got


def test_a_store_cut_anywhere_is_read_up_to_the_cut(real_store, tmp_path):
    path, originals = real_store
    data = path.read_bytes()
    rng = random.Random(11)
    page = 4096
    offsets = {0, 50, 99, 100, page, page + 1, len(data) - 1, len(data) // 2}
    offsets |= {rng.randrange(len(data)) for _ in range(40)}
    offsets |= {rng.randrange(len(data) // page) * page for _ in range(10)}
    damaged = 0
    for cut in sorted(offsets):
        target = tmp_path / f"cut-{cut}.db"
        target.write_bytes(data[:cut])
        reader, got = read_everything(target)
        if reader is None:
            continue
        for name, original in originals.items():
            if name not in got:
                continue
            steps, values = got[name]
            # Raw reads stop at the damage: a prefix of the series, every value right.
            assert steps == sorted(original)[:len(steps)], (cut, name)
            assert values == [original[s] for s in steps], (cut, name)
            for key in (name + "@4000", name + "@100"):
                assert all(original.get(s) == v for s, v in zip(*got[key])), (cut, key)
        if reader.damage is not None:
            damaged += 1
        if "after step" in str(reader.damage or ""):
            assert "steps were read" in str(reader.damage)
    assert damaged > 10


def test_a_store_with_flipped_bytes_never_crashes_a_reader(real_store, tmp_path):
    path, _ = real_store
    data = path.read_bytes()
    rng = random.Random(5)
    outcomes = {"refused": 0, "damage reported": 0, "read": 0}
    for trial in range(60):
        damaged = bytearray(data)
        for _ in range(rng.choice((1, 4, 32))):
            i = rng.randrange(100, len(damaged))  # past the file header, which only refuses
            damaged[i] ^= 1 << rng.randrange(8)
        target = tmp_path / f"flip-{trial}.db"
        target.write_bytes(bytes(damaged))
        reader, _ = read_everything(target)
        outcomes["refused" if reader is None else "damage reported" if reader.damage else "read"] += 1
    assert outcomes["damage reported"] > 5, outcomes


def test_the_damage_report_names_the_last_good_step(tmp_path):
    path = tmp_path / STORE
    writer = StoreWriter(path)
    write_steps(writer, 1, 20_000)
    writer.close()
    data = bytearray(path.read_bytes())
    db = sqlite3.connect(path)
    # The page holding a step in the middle of the loss series: wipe it.
    (page,) = db.execute(
        "SELECT pageno FROM dbstat WHERE name = 'scalars' AND pagetype = 'leaf' ORDER BY path LIMIT 1 OFFSET 20"
    ).fetchone() if _has_dbstat(db) else (None,)
    db.close()
    if page is None:
        pytest.skip("this SQLite has no dbstat table to find a page")
    size = 4096
    data[(page - 1) * size:page * size] = b"\x00" * size
    shutil.copy(path, tmp_path / "orig.db")
    path.write_bytes(bytes(data))
    with StoreReader(path) as reader:
        steps, _ = reader.series("loss")
        message = str(reader.damage)
    assert steps and steps == list(range(1, len(steps) + 1)) and len(steps) < 20_000
    assert message == message.splitlines()[0]
    assert f"after step {steps[-1]} of 'loss'" in message and f"{len(steps)} steps were read" in message
    assert "malformed" in message








def _has_dbstat(db) -> bool:
    try:
        db.execute("SELECT 1 FROM dbstat LIMIT 1").fetchall()
        return True
    except sqlite3.DatabaseError:
        return False


def test_readings_by_time_keep_every_sample_however_slow_the_steps(tmp_path):
    writer = StoreWriter(tmp_path / STORE)
    # Three slow steps and a reading every second between them: nothing is keyed by step.
    writer.write(rows=[[1, 100.0, {"loss": 1.0}]], samples=[[100.0 + s, {"host/cpu_pct": float(s)}] for s in range(60)])
    writer.write(rows=[[2, 160.0, {"loss": 0.9}]], samples=[[160.0 + s, {"host/cpu_pct": 60.0 + s}] for s in range(60)])
    writer.write(samples=[[5.0, {"host/rss_bytes": 7.0}]], rank=1)
    writer.close()
    with StoreReader(tmp_path / STORE) as reader:
        walls, values = reader.sampled("host/cpu_pct")
        assert len(walls) == 120 and values == [float(v) for v in range(120)] and walls == sorted(walls)
        assert reader.sampled("host/cpu_pct", after_wall=218.0) == ([219.0], [119.0])
        short_walls, short = reader.sampled("host/cpu_pct", max_points=10)
        assert len(short) <= 12 and min(short) == 0.0 and max(short) == 119.0  # extremes survive
        assert reader.names() == ["loss"] and reader.sampled_names() == ["host/cpu_pct"]
        assert reader.sampled_names(rank=1) == ["host/rss_bytes"] and reader.latest_samples(rank=1) == {
            "host/rss_bytes": 7.0}
        assert reader.latest_samples() == {"host/cpu_pct": 119.0}


def test_the_newest_schedule_reads_back(tmp_path):
    writer = StoreWriter(tmp_path / "m.db")
    writer.write(layers=[Schedule(step=10, steps=[11, 500], lrs=[[0.1, 0.0]], end=500)])
    writer.write(layers=[Schedule(step=40, note="set by hand")])
    writer.close()
    with StoreReader(tmp_path / "m.db") as reader:
        assert reader.schedule() == Schedule(step=40, note="set by hand")


def test_a_later_row_of_a_step_adds_its_values_and_keeps_the_steps_time(tmp_path):
    path = tmp_path / STORE
    writer = StoreWriter(path)
    writer.write(rows=[[1, 10.0, {"loss": 2.0}], [2, 20.0, {"loss": 1.9}]])
    # What the script printed at step 2, read after step 2's row was written (printed.py).
    writer.write(rows=[[2, 99.0, {"printed/val_loss": 2.29}], [3, 30.0, {"loss": 1.8}]])
    writer.close()
    with StoreReader(path) as reader:
        assert reader.walls() == ([1, 2, 3], [10.0, 20.0, 30.0])
        assert reader.series("printed/val_loss") == ([2], [2.29])
        assert reader.series("loss") == ([1, 2, 3], [2.0, 1.9, 1.8])
