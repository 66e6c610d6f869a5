"""The Layers tab: pure per-parameter state, stored records, and the table through Pilot.

The Pilot test runs a 500-parameter run: 125 stored records read on attach, then live
``Layers`` messages through the real ``transport.Server`` (``support.recorded_run.FakeEngine``).
It checks what the table shows (order, filter, selection) and prints how long a
500-row update takes; the timing is reported, not asserted.
"""

from __future__ import annotations

import asyncio
import math
import time

from ptdash.shared.protocol import LayerNames, Layers
from ptdash.tui.app import make_app
from ptdash.tui.bars import bar, sparkline, stacked
from ptdash.tui.source.live import LiveSource
from ptdash.tui.tabs.layers import LayerStats, combine, module_of, natural_key, select
from ptdash.tui.widgets.layer_table import LayerTable
from ptdash.tui.widgets.layers_view import LayersView
from support.pilot import screen_text, until
from support.recorded_run import EXPLODING, LAYER_COUNT, VANISHING, FakeEngine, layer_names, make_run


def stats_of(*messages: Layers | LayerNames) -> LayerStats:
    stats = LayerStats(history=5)
    for msg in messages:
        stats.set_names(msg) if isinstance(msg, LayerNames) else stats.add(msg)
    return stats


NAMES = ["enc.0.weight", "enc.0.bias", "enc.10.weight", "enc.2.weight", "head.weight"]


# ------------------------------------------------------------------------ pure state


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


def test_sparkline_and_bars():
    line = sparkline([1.0, 2.0, None, 4.0], 6)
    assert line.plain == "  ▁▃×█" and len(line) == 6
    assert sparkline([5.0, 5.0], 3).plain == " ▄▄"
    assert sparkline([1e-3, 1e-2, 1e-1], 3, log=True).plain == "▁▅█"
    assert bar(0.5, 10).plain == "█████░░░░░"
    assert bar(None, 4).plain == "░░░░"
    assert bar(2.0, 4).plain == "████"
    assert stacked([(0.25, "a"), (0.25, "b"), (None, "c")], 8).plain == "████░░░░"
    assert stacked([(0.01, "a")], 8).plain[0] != "░"  # a sliver, never nothing


def test_cells_keep_the_end_of_long_names_and_say_nan():
    from ptdash.tui.tabs.layers import LayerRow
    from ptdash.tui.widgets.layer_table import Column, cell

    row = LayerRow("model.encoder.layers.11.attn.out_proj.weight", "", None, None, "nonfinite", 0)
    assert cell(row, Column("name", "name", 20), ()).plain == "…ttn.out_proj.weight"
    assert cell(row, Column("norm", "grad norm", 9, "right"), ()).plain == "  NaN/Inf"
    assert cell(row, Column("flag", "flag", 9), ()).plain == "nonfinite"


# ----------------------------------------------------------------------------- Pilot


def test_layers_tab_with_500_parameters(tmp_path):
    run_dir = make_run(tmp_path, steps=500, status="running", layers=LAYER_COUNT)
    names = layer_names()

    async def scenario(engine: FakeEngine):
        app = make_app(LiveSource(run_dir), redraw_hz=20)
        async with app.run_test(size=(120, 36)) as pilot:
            view = app.query_one(LayersView)
            await until(pilot, lambda: app.source.can_control and app.state.layers.step == 500, what="history")
            await pilot.press("2")
            await until(pilot, lambda: len(view.rows) == LAYER_COUNT, what="500 rows")
            text = screen_text(app)
            assert "500 parameters" in text and "blocks.0.attn.proj.bias" in text  # names from the store
            assert [r.name for r in view.rows][:2] == ["blocks.0.attn.proj.bias", "blocks.0.attn.proj.weight"]

            # Sort by grad norm: the exploding parameter leads, the rest in falling order.
            await pilot.press("o")
            await until(pilot, lambda: view.sort == "norm" and view.rows[0].name == names[EXPLODING], what="norm sort")
            norms = [r.norm for r in view.rows if r.norm is not None]
            assert norms == sorted(norms, reverse=True)
            await until(pilot, lambda: names[EXPLODING] in screen_text(app).splitlines()[5], what="first row")

            # A live record (no names: the engine sent them long ago) moves the table.
            timings = []
            for _ in range(3):
                engine.step(4)
                engine.layers()
                step = engine.status.step
                await until(pilot, lambda: view.stats.step == step and view._seen_version == view.stats.version,
                            what=f"live step {step}")
                started = time.perf_counter()
                screen_text(app)  # a full repaint of the screen, as a terminal would get it
                timings.append((view.last_update_s, time.perf_counter() - started))
            assert view.rows[0].name == names[EXPLODING] and math.isclose(view.rows[0].norm, 500.0 + step)
            for update, paint in timings:
                print(f"\n500-row layers update {update * 1000:.1f} ms + full repaint {paint * 1000:.1f} ms")

            # Flags sort: exploding (red) above vanishing (yellow).
            await pilot.press("o", "o")
            await until(pilot, lambda: view.sort == "flag", what="flag sort")
            assert [r.name for r in view.rows[:2]] == [names[EXPLODING], names[VANISHING]]
            assert [r.flag for r in view.rows[:2]] == ["exploding", "vanishing"]

            # Filter by name, then select a row: its history is charted below the table.
            await pilot.press("slash", *"mlp.fc.w", "enter")
            expected = sorted(n for n in names if "mlp.fc.w" in n)
            await until(pilot, lambda: len(view.rows) == len(expected), what="filtered rows")
            assert isinstance(app.focused, LayerTable)  # enter hands the keys back to the table
            assert sorted(r.name for r in view.rows) == expected
            assert f"{len(expected)}/500 parameters" in screen_text(app)
            await pilot.press("o")  # back to name order, cursor on the first row
            await until(pilot, lambda: view.sort == "name", what="name sort")
            await pilot.press("down", "enter")
            chosen = sorted(expected, key=natural_key)[1]
            await until(pilot, lambda: view.selected == chosen, what="selection")
            await until(pilot, lambda: f"grad norm of  {chosen}" in screen_text(app), what="chart title")
            steps, values = view.stats.history_of(chosen)
            assert len(steps) == len(values) > 100  # stored history and live records together
            assert any(c in screen_text(app) for c in "⠁⠂⠄⡀⢀⠈⠐⠠"), "no chart drawn"
            await pilot.press("escape")
            await until(pilot, lambda: view.selected is None, what="chart closed")

            # Modules: parameters grouped by their prefix, norms combined.
            await pilot.press("m")
            await until(pilot, lambda: view.grouped and "modules" in screen_text(app), what="modules")
            assert len(view.rows) == len(expected)  # modules holding a matching parameter
            assert all(r.name.endswith("mlp.fc") for r in view.rows)
            await pilot.press("slash", "escape")
            assert isinstance(app.focused, LayerTable) and view.filter_text == "mlp.fc.w"

            # A click on a row charts it; a click on a column header sorts by it.
            await pilot.click(LayerTable, offset=(5, 2))
            await until(pilot, lambda: view.selected == view.rows[1].name, what="clicked row charted")
            columns = view._columns()
            before = columns[:[c.key for c in columns].index("norm")]
            norm_x = 1 + sum(c.width + 2 for c in before) + 3
            await pilot.click(LayerTable, offset=(norm_x, 0))
            await until(pilot, lambda: view.sort == "norm", what="header click sorts")
        return timings

    with FakeEngine(run_dir, step=500) as engine:
        timings = asyncio.run(asyncio.wait_for(scenario(engine), 300))
    assert len(timings) == 3
