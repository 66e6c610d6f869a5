"""Every anomaly and what was done about it, as the Doctor tab, ``ptdash doctor`` and ``show
--once`` list it; and the events pane's one line for the metrics the script printed."""

from __future__ import annotations

from ptdash.shared.protocol import Event
from ptdash.tui import doctor_cli
from ptdash.tui.incidents import Incidents, listing
from ptdash.tui.state import RunState
from ptdash.tui.tabs import doctor
from support.render import text_of

ROLLBACK = Event(kind="rollback", step=151, wall=2.0, rank=0,
                 message="loss spike: 1.4e+09 over the limit 62.9 at step 150: rolled back to step 144, 6 batches "
                         "skipped", data={"step": 151, "from_step": 150, "to_step": 144, "why": "loss spike",
                                          "skipped": 6})
PAUSE = Event(kind="anomaly", step=20, wall=1.0, rank=0,
              message="non-finite gradient before the update of step 21, first in head.weight; paused before the "
                      "update", data={"step": 21, "action": "pause", "layer": "head.weight"})
SKIP = Event(kind="anomaly", step=40, wall=1.5, rank=1, message="non-finite gradient before the update of step 41; "
             "update skipped", data={"step": 41, "action": "skip"})
LIMIT = Event(kind="rollback", step=300, wall=3.0, message="more than 3 rollbacks within 100 steps: pausing instead",
              data={"step": 300, "limit": 3, "within": 100, "action": "pause"})
LR_BACK = Event(kind="rollback", step=200, wall=2.5, message="LR factor back to 1 at step 200",
                data={"step": 200, "lr_scale": 1.0})
NOTE = Event(kind="checkpoint", step=10, wall=0.5, message="saved step-10.pt", data={"path": "step-10.pt"})


def _rows(*stored: Event) -> Incidents:
    folded = Incidents()
    for event in stored:
        folded.add(event)
    return folded


def test_each_rollback_skip_pause_and_anomaly_is_a_row_with_its_step_and_action():
    rows = _rows(NOTE, PAUSE, SKIP, ROLLBACK, LR_BACK, LIMIT).rows
    assert [(r.step, r.action) for r in rows] == [
        (21, "paused"), (41, "skipped"), (150, "rolled back to step 144, 6 batches skipped"), (300, "paused")]
    assert listing(rows)[2] == ("step 150 (rolled back to step 144, 6 batches skipped): loss spike: 1.4e+09 over the "
                                "limit 62.9 at step 150: rolled back to step 144, 6 batches skipped")
    assert listing(rows)[1].startswith("step 41 (rank 1) (skipped): ")


def test_the_same_words_from_several_ranks_are_one_row_naming_them():
    again = Event(kind=PAUSE.kind, step=PAUSE.step, wall=PAUSE.wall, message=PAUSE.message, data=PAUSE.data, rank=1)
    folded = _rows(PAUSE, again)
    assert len(folded) == 1 and folded.rows[0].ranks == [0, 1]
    assert listing(folded.rows) == [f"step 21 (ranks 0, 1) (paused): {PAUSE.message}"]


def test_ptdash_doctor_lists_the_anomalies_after_the_findings():
    text, count = doctor_cli.render("run (finished at step 300)", [NOTE, PAUSE, ROLLBACK, LR_BACK], width=200)
    assert count == 0
    lines = text.splitlines()
    assert lines[0] == "ptdash doctor: run (finished at step 300): no findings, 2 anomalies"
    at = lines.index("Anomalies and what was done (2):")
    assert lines[at + 1] == f"   step 21 (paused): {PAUSE.message}"
    assert lines[at + 2].startswith("   step 150 (rolled back to step 144, 6 batches skipped): loss spike")


def test_the_doctor_tab_lists_them_with_or_without_findings():
    state = RunState()
    for event in (NOTE, PAUSE, ROLLBACK):
        state.add_event(event)
    text = text_of(doctor.report(state))
    assert doctor.EMPTY in text and "2 anomalies, and what was done" in text
    assert "step 21  paused  non-finite gradient" in text
    assert "step 150  rolled back to step 144, 6 batches skipped  loss spike" in text
    before = doctor.versions(state)
    state.add_event(Event(kind="finding", step=5, wall=4.0, message="input-bound: the loop waits",
                          data={"id": "input-bound", "what": "the loop waits", "severity": "warning"}))
    state.add_event(SKIP)
    assert doctor.versions(state) != before
    text = text_of(doctor.report(state))
    assert text.index("input-bound") < text.index("3 anomalies, and what was done")


def _printed(name: str, step: int, left_out: str | None = None, rank: int = 0) -> Event:
    message = (f"printed metric {name} is left out: {left_out}" if left_out
               else f"found printed metric {name} = 0.5 at step {step}: {name} 0.5")
    return Event(kind="printed", step=step, wall=float(step), rank=rank, message=message,
                 data={"name": name, "left_out": left_out} if left_out else {"name": name, "value": 0.5})


def test_the_metrics_the_script_prints_are_one_line_of_the_events_pane():
    state = RunState()
    first = state.add_event(_printed("acc", 1))
    assert first is not None and first.text.startswith("printed metrics: 1 found (acc)")
    state.add_event(NOTE)
    for i, name in enumerate(["val_loss", "lr", "epoch", "bleu", "f1"], 2):
        state.events_changed = False
        assert state.add_event(_printed(name, i)) is None  # the line shown already changed in place
        assert state.events_changed
    assert state.add_event(_printed("acc", 9, rank=1)) is None  # another rank's find of the same name
    assert state.add_event(_printed("loss", 9, left_out="ptdash's loss")) is None
    shown = [e.text for e in state.events]
    assert len(shown) == 2 and shown[1] == "step 10 checkpoint saved step-10.pt", shown
    assert shown[0] == ("printed metrics: 6 found (acc, val_loss, lr, epoch, and 2 more); 1 left out (loss: "
                        "ptdash's loss); ptdash doctor lists each with its line")


def test_history_with_printed_metrics_gives_the_one_line_once():
    state = RunState()
    for event in [_printed("acc", 1), _printed("val_loss", 2)]:
        state.note_event(event)  # older history: counted, no line of its own
    line = state.add_event(_printed("lr", 3))
    assert line is not None and line.text.startswith("printed metrics: 3 found (acc, val_loss, lr)")
    assert state.add_event(_printed("f1", 4)) is None and len(state.events) == 1
