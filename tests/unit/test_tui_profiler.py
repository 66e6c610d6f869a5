"""The Profiler tab's report: empty, pending, a report with its top ops, a failure, a refusal."""

from __future__ import annotations

from ptdash.shared.protocol import Ack, Event
from ptdash.tui.state import RunState
from ptdash.tui.tabs import profiler
from support.recorded_run import PROFILE_TOP
from support.render import text_of


def test_profile_report_states():
    state = RunState()
    assert "press p" in text_of(profiler.report(state))
    state.profile_pending = "profiling steps 41-45…"
    assert "profiling steps 41-45…" in text_of(profiler.report(state))
    state.add_event(Event(kind="profile", step=45, wall=1.0, message="profiled steps 41-45",
                     data={"steps": [41, 45], "trace": "/runs/x/profiles/p.json", "device": "cpu", "top": PROFILE_TOP}))
    text = text_of(profiler.report(state))
    assert state.profile_pending is None
    assert "steps 41-45" in text and "aten::addmm" in text and "12.50" in text and "3.0 MiB" in text
    assert "/runs/x/profiles/p.json" in text and "Perfetto" in text
    state.add_event(Event(kind="profile", step=50, wall=2.0, message="failed",
                     data={"steps": [46, 50], "trace": None, "device": "cpu", "top": [],
                              "error": "another profiler is active"}))
    assert "profile failed: another profiler is active" in text_of(profiler.report(state))
    assert state.events[-1].level == "error"


def test_refused_profile_is_said_plainly():
    state = RunState()
    state.profile_pending = "profiling the next 5 steps…"
    state.add_ack(Ack(id="1", name="profile", ok=False, step=3, message="a profile is already being recorded"),
                  "profile 5 steps")
    assert state.profile_pending is None
    assert "profile refused: a profile is already being recorded" in text_of(profiler.report(state))
