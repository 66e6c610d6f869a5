"""The Doctor tab: findings folded once per rule (naming the ranks that raised them), newest first;
a stall's finding says the whole stall, or how long it had lasted when its run ended."""

from __future__ import annotations

import time

from ptdash.shared import events
from ptdash.shared.protocol import Event
from ptdash.shared.stacks import Frame, RankStacks, Thread
from ptdash.tui.findings import Findings
from ptdash.tui.state import RunState
from ptdash.tui.tabs import doctor
from support.render import text_of


def test_findings_once_per_rule_newest_first():
    state = RunState()
    assert doctor.EMPTY in text_of(doctor.report(state))
    for wall, step, rank, message, data in [
            (1.0, 5, 0, "grads-never-cleared: .grad keeps growing",
             {"id": "grads-never-cleared", "what": ".grad keeps growing\nof 4 parameters", "why": "backward adds",
              "fix": "zero_grad once per step", "source": "train.py:42", "severity": "error"}),
            (2.0, 5, 1, "grads-never-cleared: .grad keeps growing",
             {"id": "grads-never-cleared", "what": ".grad keeps growing", "why": "backward adds", "fix": "zero",
              "severity": "error"}),
            (3.0, 9, 0, "loss-plateau: no better loss for 500 steps",
             {"id": "loss-plateau", "what": "no better loss for 500 steps", "why": "stopped learning",
              "fix": "try another LR", "severity": "info"})]:
        line = state.add_event(Event(kind="finding", step=step, wall=wall, message=message, data=data, rank=rank))
        assert line.level == "finding" and "⚑ doctor: " in line.text
    assert len(state.findings) == 2 and state.findings.worst() == "error"  # the badge's colour
    newest, oldest = state.findings.newest_first()
    assert (newest.id, newest.severity) == ("loss-plateau", "info")
    assert (oldest.id, oldest.severity, oldest.ranks) == ("grads-never-cleared", "error", [0, 1])
    text = text_of(doctor.report(state))
    assert text.index("loss-plateau") < text.index("grads-never-cleared")
    assert "of 4 parameters" not in text  # what: its first line only
    assert "step 5, train.py:42, ranks 0, 1" in text and "why: backward adds" in text
    assert "fix: zero_grad once per step" in text and "2 findings  1 error  1 info" in text


def _stall_events(started: float) -> list[Event]:
    """A stall the real detector names (ranks.RankCollector): its event with the stacks, its finding."""
    spin = (Frame(file="/u/train.py", line=40, func="<module>", code="main()", own=True),
            Frame(file="/u/train.py", line=12, func="wait_for_lost_shard", code="while True:", own=True))
    ranks = (RankStacks(rank=0, threads=(Thread(name="MainThread", training=True, frames=spin),)),)
    kind, data = events.encode(events.Stall(step=29, seconds=3.0, started=started, stacks=ranks))
    where = "rank 0 was in `wait_for_lost_shard` (train.py:12) for 3 s so far"
    kind2, data2 = events.encode(events.Finding(id="stalled", what=where, severity="error", step=29, case="step 29",
                                                extra={"seconds": 3.0, "over": False}))
    return [Event(kind=kind, step=29, wall=started + 3, message="stalled", data=data),
            Event(kind=kind2, step=29, wall=started + 3, message=f"stalled: {where}", data=data2)]


def test_a_stall_finding_raised_again_when_over_says_the_whole_stall():
    state = RunState()
    for event in _stall_events(1000.0):
        state.add_event(event)
    version = state.findings.version
    state.add_event(Event(kind="finding", step=29, wall=1041.0, message="stalled: ...", data={
        "id": "stalled", "what": "rank 0 was in `wait_for_lost_shard` (train.py:12) for 41 s", "severity": "error",
        "step": 29, "case": "step 29", "seconds": 41.0, "over": True}))
    (finding,) = state.findings.newest_first(ended_at=5000.0)  # over: the run's end changes nothing
    assert finding.what == "rank 0 was in `wait_for_lost_shard` (train.py:12) for 41 s" and finding.extra["over"]
    assert state.findings.version > version  # the tab redraws
    assert "for 41 s" in text_of(doctor.report(state))


def test_a_stall_the_engine_could_not_end_lasted_until_the_run_ended_or_until_now():

    found = Findings()
    for event in _stall_events(1000.0):
        found.add(event)
    (killed,) = found.newest_first(ended_at=1065.0)
    assert killed.what == "rank 0 was in `wait_for_lost_shard` (train.py:12) for 65 s; the run ended while stalled"
    (written,) = found.newest_first()  # nothing known of its end: the engine's words
    assert written.what.endswith("for 3 s so far")
    live = Findings()
    for event in _stall_events(time.time() - 20):
        live.add(event)
    (going,) = live.newest_first(live=True)
    assert going.what.startswith("rank 0 was in `wait_for_lost_shard` (train.py:12) for 2") and \
        going.what.endswith(" s so far"), going.what
