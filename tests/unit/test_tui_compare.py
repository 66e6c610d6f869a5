"""The compare view's pure parts: reading a reference, placing steps in time, labels, figures."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ptdash.shared.rows import RowReader
from ptdash.shared.store import STORE_NAME
from ptdash.tui import compare
from ptdash.tui.series import Series
from support.recorded_run import make_run, run_info


def _series(steps, values) -> Series:
    s = Series()
    s.extend(steps, values)
    return s


def test_a_reference_holds_the_charted_series_and_a_clock_over_the_whole_run(tmp_path):
    run_dir = make_run(tmp_path, steps=3000, status="finished", exit_code=0)
    ref = compare.load_reference(run_dir)
    assert set(ref.series) == {"loss", "grad/norm_total", "opt/lr/group0", "opt/lr/group1"}
    assert ref.series["loss"].steps[0] == 1 and ref.series["loss"].last_step == 3000
    with RowReader(run_dir / STORE_NAME) as reader:
        steps, walls = reader.walls()
    clock = dict(zip(ref.clock.steps, ref.clock.values))
    assert ref.clock.steps[0] == 1 and ref.clock.steps[-1] == 3000 and len(clock) <= compare.CLOCK_POINTS
    assert all(clock[s] == w for s, w in zip(steps, walls) if s in clock)
    assert compare.load_reference(tmp_path / "nowhere").series == {}


def test_elapsed_interpolates_between_clock_points_and_holds_at_the_ends():
    clock = _series([1, 11, 21], [100.0, 101.0, 103.0])
    assert compare.elapsed([1, 6, 11, 16, 21], clock) == [0.0, 0.5, 1.0, 2.0, 3.0]
    assert compare.elapsed([0, 30], clock) == [0.0, 3.0]
    assert compare.elapsed([5], Series()) == [0.0]


def test_labels_are_names_unless_two_runs_share_one():
    a, b, c = Path("/r/20260101-a-train"), Path("/r/20260102-b-train"), Path("/r/x")
    def named(name):
        return replace(run_info(), name=name)

    infos = [(a, named("train")), (b, named("train")), (c, named("other"))]
    assert compare.labels(infos) == ["20260101-a-train", "20260102-b-train", "other"]
    assert compare.labels([(c, None)]) == ["x"]


def test_time_unit_follows_the_longest_run():
    def run(span):
        return compare.Run("r", "red", {}, _series([1, 2], [0.0, span]), None)

    assert compare.time_unit([run(100)]) == (1, "s")
    assert compare.time_unit([run(100), run(3600)]) == (60, "min")
    assert compare.time_unit([run(20 * 3600)]) == (3600, "h")


def test_figures_and_a_narrow_table():
    series = {"loss": _series([1, 2, 3], [2.0, 0.5, 0.75]), "opt/lr/group0": _series([1, 3], [1e-3, 2e-3]),
              "grad/norm_total": _series([1, 2, 3], [3.0, None, 1.0])}
    row = compare.figures(compare.Run("a", "red", series, _series([1, 3], [10.0, 12.0]),
                                      run_info(status="crashed", exit_code=1)))
    assert row == ["a", "crashed (1)", "3", "2s", "1", "2 → 0.75", "0.5 @2", "2e-3", "1–3"]
    assert compare.figures(compare.Run("b", "red", {}, Series(), None))[1:] == ["—"] * 8
    assert compare.fit_columns([row], 200) == list(range(len(compare.FIGURES)))
    narrow = compare.fit_columns([row], 60)
    assert narrow[:3] == [0, 1, 2] and 5 in narrow and 4 not in narrow  # steps/s goes first


def test_the_printed_panel_overlays_each_runs_metric_the_main_run_starts_with(tmp_path):
    main = make_run(tmp_path / "a", steps=500, status="finished", exit_code=0, printed=True)
    other = make_run(tmp_path / "b", steps=300, status="finished", exit_code=0, printed=True, seed=3)
    plain = make_run(tmp_path / "c", steps=200, status="finished", exit_code=0)
    refs = [compare.load_reference(d) for d in (main, other, plain)]
    assert {"printed/val_loss", "printed/val_acc", "printed/test_bleu"} <= set(refs[1].series)
    runs = [compare.Run(f"run{i}", colour, ref.series, ref.clock, ref.info)
            for i, (ref, colour) in enumerate(zip(refs, ("green", "cyan", "magenta")))]
    legend, chart = compare.printed(runs)
    # The main run's panel starts with its validation loss: each run's is drawn, by that name.
    assert legend.plain.startswith("val_loss  ") and "run2 —" in legend.plain
    assert [line.steps[-1] for line in chart.lines] == [300, 500]  # the main run's last, so on top
    assert chart.lines[-1].values == refs[0].series["printed/val_loss"].values
