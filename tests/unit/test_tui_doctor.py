"""The Doctor tab: findings folded once per rule (naming the ranks that raised them), newest first."""

from __future__ import annotations

from ptdash.shared.protocol import Event
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
