"""The Layers tab's state: per-parameter history, renames, modules, sort and filter, and its cells."""

from __future__ import annotations

from ptdash.shared.protocol import LayerNames, Layers
from ptdash.tui.tabs.layers import LayerRow, LayerStats, combine, module_of, natural_key, select
from ptdash.tui.widgets.layer_table import Column, cell

NAMES = ["enc.0.weight", "enc.0.bias", "enc.10.weight", "enc.2.weight", "head.weight"]


def stats_of(*messages: Layers | LayerNames) -> LayerStats:
    stats = LayerStats(history=5)
    for msg in messages:
        stats.set_names(msg) if isinstance(msg, LayerNames) else stats.add(msg)
    return stats


def test_layer_stats_keep_names_history_and_last_ratio():
    stats = stats_of(
        LayerNames(step=1, names=NAMES, shapes=[[4, 4], [4], [4, 4], [4, 4], [2, 4]]),
        Layers(step=1, grad_norms=[1.0, 2.0, 3.0, 4.0, 5.0], update_ratios=[0.1] * 5),
        *[Layers(step=s, grad_norms=[float(s), None, 3.0, 4.0, 5.0], flags={"1": "nonfinite"}) for s in range(2, 9)],
    )
    assert stats.names == NAMES and stats.step == 8
    assert list(stats.steps) == [4, 5, 6, 7, 8]  # a ring of the last 5
    assert list(stats.norms[0]) == [4.0, 5.0, 6.0, 7.0, 8.0]
    assert stats.ratios == [0.1] * 5  # None in between keeps the last sampled ratios
    rows = {r.name: r for r in stats.rows()}
    assert rows["enc.0.bias"].norm is None and rows["enc.0.bias"].flag == "nonfinite"
    assert rows["enc.0.weight"].shape == "4×4"
    # An older step is ignored.
    stats.add(Layers(step=3, grad_norms=[0.0] * 5))
    assert stats.step == 8 and stats.norms[0][-1] == 8.0


def test_layer_stats_rename_keeps_history_of_parameters_that_stay():
    stats = stats_of(LayerNames(step=1, names=["a.w", "b.w"], shapes=[[1], [1]]), Layers(step=1, grad_norms=[1.0, 2.0]),
                     Layers(step=2, grad_norms=[1.5, 2.5]))
    stats.set_names(LayerNames(step=3, names=["b.w", "c.w", "a.w"], shapes=[[1]] * 3))
    stats.add(Layers(step=3, grad_norms=[3.0, 9.0, 2.7]))
    assert stats.names == ["b.w", "c.w", "a.w"]
    assert list(stats.norms[0]) == [2.0, 2.5, 3.0]
    assert list(stats.norms[1]) == [None, None, 9.0]
    # A list of another length without names gets numbered names until names come,
    # and keeps its history when they do.
    stats.add(Layers(step=4, grad_norms=[1.0]))
    assert stats.names == ["param0"]
    stats.add(Layers(step=5, grad_norms=[2.0]))
    stats.set_names(LayerNames(step=4, names=["d.w"], shapes=[[3]]))
    assert stats.names == ["d.w"] and list(stats.norms[0])[-2:] == [1.0, 2.0]


def test_modules_combine_norms_and_take_the_loudest_flag():
    stats = stats_of(LayerNames(step=1, names=NAMES, shapes=[[1]] * 5),
                     Layers(step=1, grad_norms=[3.0, 4.0, 1.0, 2.0, 0.5],
                            update_ratios=[0.1, 0.3, None, 0.2, 0.1], flags={"0": "vanishing", "1": "exploding"}))
    assert module_of("enc.0.weight") == "enc.0" and module_of("scale") == "scale"
    rows = {r.name: r for r in stats.rows(grouped=True)}
    assert set(rows) == {"enc.0", "enc.10", "enc.2", "head"}
    assert rows["enc.0"].norm == 5.0 and rows["enc.0"].ratio == 0.3 and rows["enc.0"].flag == "exploding"
    assert rows["enc.0"].shape == "2 tensors"
    assert combine([3.0, None]) is None
    steps, norms = stats.history_of("enc.0", grouped=True)
    assert steps == [1] and norms == [5.0]
    assert stats.history_of("nope") == ([], [])


def test_select_sorts_and_filters():
    stats = stats_of(LayerNames(step=1, names=NAMES, shapes=[[1]] * 5),
                     Layers(step=1, grad_norms=[1.0, None, 30.0, 2.0, 0.5],
                            update_ratios=[0.1, 0.3, 0.2, None, 0.05], flags={"1": "nonfinite", "4": "vanishing"}))
    rows = stats.rows()
    assert [r.name for r in select(rows, sort="name")] == [
        "enc.0.bias", "enc.0.weight", "enc.2.weight", "enc.10.weight", "head.weight"]
    assert [r.name for r in select(rows, sort="norm")] == [
        "enc.0.bias", "enc.10.weight", "enc.2.weight", "enc.0.weight", "head.weight"]  # NaN first
    assert [r.name for r in select(rows, sort="ratio")][:2] == ["enc.0.bias", "enc.10.weight"]
    assert [r.name for r in select(rows, sort="ratio")][-1] == "enc.2.weight"  # never sampled: last
    assert [r.flag for r in select(rows, sort="flag")][:2] == ["nonfinite", "vanishing"]
    assert [r.name for r in select(rows, "ENC weight", "name")] == ["enc.0.weight", "enc.2.weight", "enc.10.weight"]
    assert select(rows, "nothing-matches") == []
    modules = stats.rows(grouped=True)
    assert [r.name for r in select(modules, "enc bias")] == ["enc.0"]  # by a parameter's name
    assert sorted(["b10", "b9", "a"], key=natural_key) == ["a", "b9", "b10"]


def test_cells_keep_the_end_of_long_names_and_say_nan():
    row = LayerRow("model.encoder.layers.11.attn.out_proj.weight", "", None, None, "nonfinite", 0)
    assert cell(row, Column("name", "name", 20), ()).plain == "…ttn.out_proj.weight"
    assert cell(row, Column("norm", "grad norm", 9, "right"), ()).plain == "  NaN/Inf"
    assert cell(row, Column("flag", "flag", 9), ()).plain == "nonfinite"
