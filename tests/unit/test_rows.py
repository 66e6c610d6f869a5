"""RowReader: a store's rows one step at a time, in windows, and a series' extremes."""

from __future__ import annotations

import sqlite3

import pytest

from ptdash.shared.reader import StoreReader
from ptdash.shared.rows import RowReader
from ptdash.shared.store import STORE_NAME
from support.recorded_run import make_ddp_run, make_run


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    return make_ddp_run(tmp_path_factory.mktemp("rows"), steps=300, status="finished", exit_code=0)


def _columns_of(rows, columns):
    out = {c.label: ([], []) for c in columns}
    for step, _, values in rows:
        for c, v in zip(columns, values):
            if v is not None:
                out[c.label][0].append(step)
                out[c.label][1].append(v)
    return out


def test_rows_hold_every_series_of_every_rank_whatever_the_window(ddp_run):
    with RowReader(ddp_run / STORE_NAME) as reader:
        columns = reader.columns()
        labels = [c.label for c in columns]
        assert "loss" in labels and "rank1/loss" in labels and "rank1/opt/lr/group0" not in labels
        whole = list(reader.rows(columns, window=10_000))
        for window in (1, 7, 64):
            assert list(reader.rows(columns, window=window)) == whole
        by_label = _columns_of(whole, columns)
        for c in columns:
            assert by_label[c.label] == reader.series(c.series, rank=c.rank), c.label
        steps, walls = reader.walls()
        assert [(s, w) for s, w, _ in whole] == list(zip(steps, walls))


def test_rows_end_at_last_step(ddp_run):
    with RowReader(ddp_run / STORE_NAME) as reader:
        columns = reader.columns()
        assert [s for s, _, _ in reader.rows(columns, window=16, last_step=50)] == list(range(1, 51))


def test_layer_columns_follow_the_parameter_names(tmp_path):
    run_dir = make_run(tmp_path, steps=40, layers=20)
    with RowReader(run_dir / STORE_NAME) as reader:
        columns = reader.columns(layers=True)
        names = reader.layer_names().names
        assert [c.label for c in columns if c.field][:2] == [f"layer/{names[0]}/grad_norm",
                                                            f"layer/{names[0]}/update_ratio"]
        rows = {step: values for step, _, values in reader.rows(columns, window=5)}
        index = next(i for i, c in enumerate(columns) if c.label == f"layer/{names[3]}/grad_norm")
        for record in reader.layers():
            assert rows[record.step][index] == record.grad_norms[3]
        assert rows[3][index] is None  # a step without a record


def test_stats_from_the_summary_match_the_series_and_the_raw_rows(tmp_path):
    run_dir = make_run(tmp_path, steps=5000)
    with RowReader(run_dir / STORE_NAME) as reader:
        steps, values = reader.series("grad/norm_total")
        stats = reader.stats("grad/norm_total")
        assert (stats.first, stats.last) == ((steps[0], values[0]), (steps[-1], values[-1]))
        assert stats.low.value == min(values) and values[steps.index(stats.low.step)] == min(values)
        assert stats.high == (321, 7.5)  # the recorded spike
        assert reader.stats("no/such") is None
    with sqlite3.connect(run_dir / STORE_NAME) as db:  # a store written before the summary table
        db.execute("DELETE FROM summary")
    with RowReader(run_dir / STORE_NAME) as reader:
        assert reader.stats("grad/norm_total") == stats
        assert reader.wall_range()[0][0] == 1 and reader.wall_range()[1][0] == 5000


def test_a_damaged_store_yields_the_rows_before_the_damage(tmp_path):
    run_dir = make_run(tmp_path, steps=3000)
    path = run_dir / STORE_NAME
    with StoreReader(path) as reader:
        total = reader.last_step()
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2 + 100])  # cut inside a page
    with RowReader(path) as reader:
        columns = reader.columns()
        rows = list(reader.rows(columns, window=256))
        assert reader.damage is not None
        assert len(rows) < total
