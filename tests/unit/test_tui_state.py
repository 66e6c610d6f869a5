"""RunState: what the dashboard folds from the source's deliveries."""

import pytest

from ptdash.shared.protocol import Ack, Event, Metrics, Status
from ptdash.tui.state import RunState
from support.recorded_run import run_info


def test_run_state_folds_messages():
    state = RunState()
    state.add_metrics(Metrics(rows=[[1, 10.0, {"loss": 2.0}], [2, 10.5, {"loss": None, "opt/lr/group0": 0.1}]]))
    state.add_metrics(Metrics(rows=[[3, 11.0, {"loss": 1.0}]], rank=1))  # other ranks are not charted
    assert state.series["loss"].steps == [1, 2]
    assert state.series["opt/lr/group0"].values == [0.1]
    assert state.rate.rate() == pytest.approx(2.0)
    line = state.add_ack(Ack(id="a", name="clip", ok=True, step=540), "clip 0.5")
    assert line.text == "step 540 clip 0.5 applied" and line.level == "ok"
    bad = state.add_ack(Ack(id="b", name="clip", ok=False, message="no"), "clip 5")
    assert bad.level == "error" and "refused: no" in bad.text
    # The command event of an ack already shown is not shown twice.
    assert state.add_event(Event(kind="command", step=540, wall=1.0, message="x", data={"id": "a"})) is None
    event = state.add_event(Event(kind="anomaly", step=7, wall=1.0, message="nan loss"))
    assert event.level == "error" and event.text == "step 7 anomaly: nan loss"
    state.status = Status(state="finished", step=3, exit_code=0)
    assert state.ended


def test_anomaly_pause_reason_lasts_while_paused():
    state = RunState()
    state.set_status(Status(state="running", step=10))
    state.add_event(Event(kind="anomaly", step=11, wall=1.0, data={"action": "pause", "layer": "fc1.weight"},
                     message="non-finite gradient before the update of step 11, first in fc1.weight"))
    assert state.events[-1].level == "error"
    state.set_status(Status(state="paused", step=10, paused_at=10))
    assert state.pause_reason == "non-finite gradient in fc1.weight"
    state.set_status(Status(state="running", step=10))
    assert state.pause_reason is None


def test_start_and_end_come_from_run_json_else_from_the_steps():
    state = RunState()
    assert state.started_at is None and state.ended_at is None
    state.add_metrics(Metrics(rows=[[1, 100.0, {"loss": 1.0}], [2, 101.0, {"loss": 1.0}]]))
    assert (state.started_at, state.ended_at) == (100.0, 101.0)
    state.info = run_info(created=90.0)
    assert (state.started_at, state.ended_at) == (90.0, 101.0)
    state.info = run_info(created=90.0, started=95.0, ended=120.0)
    assert (state.started_at, state.ended_at) == (95.0, 120.0)


def test_run_json_says_how_many_ranks_and_which_failed():
    state = RunState(info=run_info(world_size=2))
    assert state.world_size == 2
    state.note_info(run_info(rank_failures=[{"rank": 3, "exitcode": -9}, {"rank": 0, "exitcode": 1}]))
    assert state.world_size == 4 and state.rank_failures == {3: -9, 0: 1}
