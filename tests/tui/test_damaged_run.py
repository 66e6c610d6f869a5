"""A damaged store opened in the dashboard: it shows what was read and says where it stopped."""

from __future__ import annotations

import time


def test_the_dashboard_opens_a_damaged_run_and_says_where_it_stopped(tmp_path):
    import asyncio

    from ptdash.tui.app import make_app
    from ptdash.tui.source.history import load_history
    from ptdash.tui.source.replay import ReplaySource
    from ptdash.tui.widgets.events_pane import EventsPane
    from support.recorded_run import make_run

    run_dir = make_run(tmp_path, steps=3000, status="finished", exit_code=0)
    store = run_dir / "metrics.db"
    data = store.read_bytes()
    store.write_bytes(data[:len(data) * 2 // 3 + 1000])
    history = load_history(run_dir)
    notes = [e.message for e in history.events if e.kind == "warning"]
    assert len(notes) == 1 and "damaged" in notes[0], history.events
    loss_steps = history.series["loss"][0]
    assert loss_steps and loss_steps[0] == 1 and loss_steps == sorted(loss_steps)

    async def scenario():
        app = make_app(ReplaySource(run_dir))
        async with app.run_test(size=(120, 36)) as pilot:
            deadline = time.monotonic() + 20
            while not (any("damaged" in line.text for line in app.state.events)
                       and app.state.connection_note == "replay (read-only)"):
                assert time.monotonic() < deadline, "no damage report reached the dashboard"
                await pilot.pause(0.05)
            await pilot.pause(0.5)  # the last redraw the replay asked for
            assert app.query_one(EventsPane) is not None
            return app.state.series["loss"].last_step

    last = asyncio.run(scenario())
    assert last is not None and last < 3000
