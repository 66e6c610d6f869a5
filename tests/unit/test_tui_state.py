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


def test_a_command_is_one_line_from_sent_to_applied():
    state = RunState()
    sent = state.note_sent("c1", "clip 0.5 sent")
    line = state.add_ack(Ack(id="c1", name="clip", ok=True, step=540, message="clip norm 1 -> 0.5"), "clip 0.5")
    assert line is sent and state.events == [sent] and state.events_changed
    assert line.text == "step 540 clip norm 1 -> 0.5" and line.level == "ok"


def test_a_checkpoint_is_one_line():
    state = RunState()
    state.note_sent("k1", "checkpoint sent")
    summary = "saved checkpoints/step-100.pt (12.0 MB in 0.31 s)"
    assert state.add_event(Event(kind="checkpoint", step=100, wall=1.0, message=summary)) is not None
    line = state.add_ack(Ack(id="k1", name="checkpoint", ok=True, step=100, message=summary), "checkpoint")
    assert [e.text for e in state.events] == [f"step 100 checkpoint {summary}"] and line is state.events[0]
    # The event arriving after the ack says nothing new either.
    state.note_sent("k2", "checkpoint sent")
    state.add_ack(Ack(id="k2", name="checkpoint", ok=True, step=200, message="saved b"), "checkpoint")
    assert state.add_event(Event(kind="checkpoint", step=200, wall=2.0, message="saved b")) is None
    assert len(state.events) == 2
    # A periodic checkpoint (no command) is its event's line.
    assert state.add_event(Event(kind="checkpoint", step=300, wall=3.0, message="saved c")) is not None


def test_total_epoch_and_paused_time_come_from_status_series_and_events():
    state = RunState(info=run_info())
    assert state.total_steps is None and state.epoch is None
    state.set_status(Status(state="running", step=5, total_steps=1120, epoch=2))
    assert state.total_steps == 1120 and state.epoch == 2
    state.set_status(Status(state="running", step=5))
    state.add_metrics(Metrics(rows=[[s, 100.0 + s, {"train/epoch": 3.0}] for s in range(1, 6)]))
    assert state.epoch == 3
    state.add_event(Event(kind="command", step=5, wall=105.5, message="pause: paused at step 5",
                          data={"id": "p", "name": "pause", "ok": True}))
    state.add_event(Event(kind="command", step=5, wall=205.5, message="resume: resumed at step 5",
                          data={"id": "r", "name": "resume", "ok": True}))
    state.add_metrics(Metrics(rows=[[s, 200.0 + s, {}] for s in range(6, 11)]))
    assert state.rate.rate() == pytest.approx(1.0)  # not 10 steps in 110 s
