"""--notify's pure parts: which events are told (notices), and the rate of one call a kind a
minute, the rest summed in the next (limiter), on a clock the test turns."""

from __future__ import annotations

import pytest

from ptdash.shared import events
from ptdash.shared.config import RunInfo
from ptdash.shared.protocol import Event
from ptdash.tui.notify.limiter import RateLimiter
from ptdash.tui.notify.notices import Notice, end_state, of_end, of_event, payload
from ptdash.tui.notify.watcher import parse_kinds


def _event(data: events.EventData, message: str = "m", step: int = 5) -> Event:
    kind, fields = events.encode(data)
    return Event(kind=kind, step=step, wall=100.0, message=message, data=fields)


def test_the_events_that_need_a_person_are_told_and_no_others():
    assert of_event(_event(events.Rollback(step=42, from_step=43, to_step=40, why="nan", skipped=3))).kind == "rollback"
    assert of_event(_event(events.Anomaly(step=7, action="pause", layer="fc.weight"))).kind == "pause"
    assert of_event(_event(events.Rollback(step=9, limit=3, within=1000, action="pause"))).kind == "pause"
    assert of_event(_event(events.Stall(step=3, ranks=(1,), seconds=120.0))).kind == "stall"
    restart = Event(kind="restart", step=50, wall=1.0, message="attempt 2", data={"attempt": 2})
    assert of_event(restart).kind == "restart"
    # Not for a person: a skipped step, a stall that ended, an LR lowered after a rollback, a checkpoint.
    assert of_event(_event(events.Anomaly(step=7, action="skip"))) is None
    assert of_event(_event(events.Stall(step=3, ended=True))) is None
    assert of_event(_event(events.Rollback(step=50, lr_scale=0.5))) is None
    assert of_event(Event(kind="checkpoint", step=1, wall=1.0, message="saved", data={})) is None


def _info(**fields) -> RunInfo:
    return RunInfo(id="ab", name="train", run_dir="/runs/train", socket="/s", **fields)


@pytest.mark.parametrize(("status", "code", "detail", "state"), [
    ("finished", 0, None, "finished"), ("stopped", 0, None, "stopped"), ("crashed", 1, "ValueError: x", "crashed"),
    ("crashed", -9, "the engine was killed by SIGKILL", "killed"), ("crashed", 1, "killed by ptdash: stuck", "killed")])
def test_the_end_says_how_the_run_ended_and_its_exit(status, code, detail, state):
    info = _info(status=status, exit_code=code, detail=detail, step=120)
    assert end_state(info) == state
    body = payload(of_end(info), info)
    assert body["event"] == "end" and body["state"] == state and body["exit_code"] == code
    assert body["run"] == "train" and body["run_dir"] == "/runs/train" and body["step"] == 120
    assert body["text"].startswith(f"ptdash train: end: run train {state}")


def _notice(kind: str, step: int) -> Notice:
    return Notice(kind, f"{kind} at {step}", step)


def test_a_burst_makes_one_call_a_kind_then_one_summed_call_a_minute_later():
    limiter = RateLimiter(60.0)
    assert limiter.offer(_notice("rollback", 1), now=0.0).count == 1
    assert [limiter.offer(_notice("rollback", s), now=t) for s, t in ((2, 1.0), (3, 2.0), (4, 30.0))] == [None] * 3
    assert limiter.offer(_notice("stall", 9), now=3.0) is not None  # another kind has its own minute
    assert limiter.due(59.9) == []
    (summed,) = limiter.due(60.0)
    assert summed.count == 3 and summed.notice.step == 4 and [n.step for n in summed.earlier] == [2, 3]
    assert limiter.due(200.0) == []  # nothing held: nothing to send
    assert limiter.offer(_notice("rollback", 5), now=100.0) is None  # the summed call was at 60
    assert limiter.offer(_notice("rollback", 6), now=121.0).count == 1


def test_what_is_held_at_the_end_goes_with_the_end_call():
    limiter = RateLimiter(60.0)
    limiter.offer(_notice("rollback", 1), now=0.0)
    limiter.offer(_notice("rollback", 2), now=1.0)
    limiter.offer(_notice("rollback", 3), now=2.0)
    held = limiter.held_summary()
    assert held == {"rollback": {"count": 2, "first_step": 2, "step": 3, "message": "rollback at 3"}}
    assert limiter.held_summary() == {} and limiter.due(1000.0) == []


def test_notify_on_takes_known_kinds_only():
    assert parse_kinds("end,rollback") == {"end", "rollback"}
    assert parse_kinds("all") == {"end", "pause", "rollback", "stall", "restart"}
    with pytest.raises(ValueError, match="crash"):
        parse_kinds("end,crash")
