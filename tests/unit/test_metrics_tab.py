"""The Metrics tab's choices without an app: every series, the script's first, a regular
expression filter, pages; and the runs view's rows and filter."""

from __future__ import annotations

import pytest

from ptdash.shared import rundir
from ptdash.shared.protocol import Metrics, Samples
from ptdash.tui.runs import RunSummary
from ptdash.tui.runsview import matching, run_rows
from ptdash.tui.state import RunState
from ptdash.tui.tabs import metrics
from support.recorded_run import make_run


def _state() -> RunState:
    state = RunState()
    rows = [[s, 100.0 + s, {"loss": 1.0 / s, "grad/norm_total": 2.0, "time/step_s": 0.1, "ptdash/step_pct": 0.3,
                            "printed/valid_loss": 1.1 / s, "printed/valid_acc": 0.5, "user/train_acc": 0.4}]
            for s in range(1, 11)]
    state.add_metrics(Metrics(rows=rows))
    state.add_samples(Samples(rows=[[100.0 + w, {"host/cpu_pct": 50.0, "gpu0/mem_allocated_bytes": 1e9}]
                                    for w in range(5)]))
    state.get("printed/empty")  # a series with no point yet is not shown
    return state


def test_every_series_is_there_what_the_script_reported_first_and_the_machine_last():
    assert metrics.series_names(_state()) == [
        "printed/valid_acc", "printed/valid_loss", "user/train_acc",  # the script's
        "grad/norm_total", "loss", "time/step_s", "ptdash/step_pct",  # training, time, ptdash's cost
        "gpu0/mem_allocated_bytes", "host/cpu_pct"]  # the machine's, by time


def test_a_regular_expression_filters_the_names_and_a_bad_one_is_said_in_a_line():
    names = metrics.series_names(_state())
    assert metrics.matching(names, metrics.compile_filter("valid")) == ["printed/valid_acc", "printed/valid_loss"]
    assert metrics.matching(names, metrics.compile_filter("^(loss|host/)")) == ["loss", "host/cpu_pct"]
    assert metrics.matching(names, metrics.compile_filter("VALID_ACC")) == ["printed/valid_acc"]
    assert metrics.compile_filter("  ") is None
    with pytest.raises(ValueError, match="not a regular expression"):
        metrics.compile_filter("valid(")


def test_pages_hold_what_fits_and_a_page_past_the_end_is_the_last():
    names = [f"s{i}" for i in range(7)]
    assert metrics.page(names, 0, 3) == metrics.Page(["s0", "s1", "s2"], 0, 3)
    assert metrics.page(names, 5, 3) == metrics.Page(["s6"], 2, 3)
    assert metrics.page([], 0, 4) == metrics.Page([], 0, 1)


def test_a_reading_by_time_is_drawn_against_seconds_since_the_first():
    state = _state()
    xs, values = metrics.points(state, "host/cpu_pct")
    assert xs == [0.0, 1.0, 2.0, 3.0, 4.0] and values == [50.0] * 5
    assert metrics.by_time(state, "host/cpu_pct") and not metrics.by_time(state, "loss")
    assert "by time" in metrics.panel(state, "host/cpu_pct").note.plain
    assert metrics.panel(state, "loss").legend.plain.startswith("0.1")


def test_the_runs_view_lists_newest_first_with_the_newest_loss_and_filters_by_words(tmp_path):
    old = make_run(tmp_path, steps=50, status="finished", exit_code=0, name="baseline", now=1_700_000_000.0)
    new = make_run(tmp_path, steps=30, status="crashed", exit_code=1, name="lr-3e-3", seed=3, now=1_700_100_000.0)
    rows = run_rows([RunSummary(p, rundir.read_info(p)) for p in (old, new)])
    assert [(r.name, r.state, r.step) for r in rows] == [("lr-3e-3", "crashed", 30), ("baseline", "finished", 50)]
    assert all(r.loss is not None for r in rows)
    assert [r.name for r in matching(rows, "CRASHED lr")] == ["lr-3e-3"]
    assert matching(rows, "nothing") == []
