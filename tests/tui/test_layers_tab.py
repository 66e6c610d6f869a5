"""The Layers tab through Pilot.

The test runs a 500-parameter run: 125 stored records read on attach, then live
``Layers`` messages through the real ``transport.Server`` (``support.recorded_run.FakeEngine``).
It checks what the table shows (order, filter, selection) and prints how long a
500-row update takes; the timing is reported, not asserted.
"""

from __future__ import annotations

import asyncio
import math
import time

from ptdash.shared import names as series_names
from ptdash.shared.store import STORE_NAME, StoreWriter
from ptdash.tui.app import make_app
from ptdash.tui.source.live import LiveSource
from ptdash.tui.source.replay import ReplaySource
from ptdash.tui.tabs.layers import natural_key
from ptdash.tui.widgets.layer_table import LayerTable
from ptdash.tui.widgets.layers_view import LayersView
from support.pilot import screen_text, until
from support.recorded_run import EXPLODING, LAYER_COUNT, VANISHING, FakeEngine, layer_names, make_run


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
            # The first row, under the header, the tabs and the table's head.
            await until(pilot, lambda: names[EXPLODING] in screen_text(app).splitlines()[4], what="first row")

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


def test_a_sharded_runs_layers_say_they_are_rank_0s_shards(tmp_path):
    # An FSDP run records its shards' norm as grad/norm_local (engine/sharded.py): each
    # per-layer norm is then of rank 0's part of a parameter, and the tab says so.
    plain, sharded = (make_run(tmp_path / kind, steps=40, status="finished", exit_code=0, layers=8)
                      for kind in ("plain", "sharded"))
    StoreWriter(sharded / STORE_NAME).write(rows=[[40, time.time(), {series_names.GRAD_NORM_LOCAL: 0.5}]])

    async def scenario(run_dir):
        app = make_app(ReplaySource(run_dir))
        async with app.run_test(size=(120, 36)) as pilot:
            await until(pilot, lambda: app.state.layers.step == 40, what="layers")
            await pilot.press("2")
            await until(pilot, lambda: "8 parameters" in screen_text(app), what="the tab's summary")
            return screen_text(app)

    assert "rank 0's shards" not in asyncio.run(scenario(plain))
    assert "rank 0's shards (each norm: its part of the parameter)" in asyncio.run(scenario(sharded))
