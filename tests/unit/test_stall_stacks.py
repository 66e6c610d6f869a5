"""The hub's stall detector takes every rank's stacks when it names a stall (ranks.RankCollector):
the stall is named by them when step counts cannot tell, kept with the event, and each stall
is a doctor finding of its own."""

from __future__ import annotations

import threading
import time

from ptdash.ranks import RankCollector
from ptdash.shared import events
from ptdash.shared.stacks import Frame, RankStacks, Thread
from ptdash.shared.store import StoreWriter

SITE = "/venv/lib/python3.11/site-packages/"


def _rank(rank: int, *inner: Frame) -> dict:
    main = Frame(file="/u/train.py", line=40, func="<module>", code="main()", own=True)
    return RankStacks(rank=rank, threads=(Thread(name="MainThread", training=True, frames=(main, *inner)),)).to_data()


SPIN = Frame(file="/u/train.py", line=12, func="wait_for_lost_shard", code="while True:", own=True)
WAIT = (Frame(file="/u/train.py", line=15, func="main", code="loss.backward()", own=True),
        Frame(file=SITE + "torch/_tensor.py", line=623, func="backward", lib="torch"))


def _wait(found: list, n: int) -> None:
    deadline = time.monotonic() + 30
    while len(found) < n and time.monotonic() < deadline:
        time.sleep(0.02)


def test_a_stall_every_rank_waits_at_is_named_by_the_stacks_and_kept_with_them():
    journaled: list = []
    collector = RankCollector(None, lambda msg: None, lambda what, message: journaled.append((what, message)),
                              lambda: "running", stall_seconds=0.05)
    collector.stacks = lambda: [_rank(0, *WAIT), _rank(1, SPIN)]
    collector.receive(1, {"rows": []})
    collector.collect([[29, 1.0, {"loss": 1.0}]])
    collector._progress[1] = collector._progress[0]  # both ranks at step 29, as the hub heard them
    time.sleep(0.2)
    collector.collect([])
    _wait(journaled, 2)
    (stall, text), (finding, said) = journaled[:2]
    assert isinstance(stall, events.Stall) and stall.ranks == (1,) and stall.step == 29
    assert [r.rank for r in stall.stacks] == [0, 1] and stall.stacks[1].training.frames[-1].func == "wait_for_lost_shard"
    assert text.startswith("rank 1 stalled: no step for 0 s (at step 29); the others wait for it (by the stacks): "
                           "rank 1 was in `wait_for_lost_shard` (train.py:12)")
    assert isinstance(finding, events.Finding) and finding.id == "stalled" and finding.case == "step 29"
    assert "rank 0 waited in `loss.backward()` (train.py:15)" in finding.what and said.startswith("stalled: ")
    assert collector.stalled == text

    collector.collect([[30, 2.0, {"loss": 1.0}]])  # rank 0 steps: the stall is over
    assert isinstance(journaled[2][0], events.Stall) and journaled[2][0].ended and collector.stalled is None
    assert journaled[3][0].case == "step 29" and journaled[3][0].extra["over"]  # its finding, whole
    collector.collect([[31, 3.0, {"loss": 1.0}]])
    collector._progress[1] = collector._progress[0]
    time.sleep(0.2)
    collector.collect([])
    _wait(journaled, 6)
    assert journaled[5][0].case == "step 31"  # another stall, another finding


def _collector(journaled: list, state: list, taken=None) -> RankCollector:
    collector = RankCollector(None, lambda msg: None, lambda what, message: journaled.append((what, message)),
                              lambda: state[0], stall_seconds=0.05)
    collector.stacks = taken or (lambda: [_rank(0, SPIN)])
    return collector


def _stalled_at(collector: RankCollector, journaled: list, step: int, wall: float) -> None:
    collector.collect([[step, wall, {"loss": 1.0}]])
    time.sleep(0.2)
    collector.collect([])
    _wait(journaled, 2)


def test_a_stall_over_says_its_whole_length_from_the_steps_own_times():
    journaled, state = [], ["running"]
    collector = _collector(journaled, state)
    _stalled_at(collector, journaled, 29, 1000.0)
    (stall, _), (finding, _) = journaled
    assert stall.started == 1000.0 and not stall.ended and not finding.extra["over"]
    assert "rank 0 was in `wait_for_lost_shard` (train.py:12) for 0 s so far" in finding.what, finding.what
    # The flush that brings step 30 also has 31: the stall ended with the first step after it.
    collector.collect([[30, 1040.25, {"loss": 1.0}], [31, 1040.5, {"loss": 1.0}]])
    (end, said), (again, _) = journaled[2:]
    assert end.ended and not end.with_run and end.step == 29 and end.seconds == 40.25 and end.started == 1000.0
    assert said == "the stall at step 29 is over after 40 s: every rank makes steps again"
    assert again.id == "stalled" and again.case == "step 29" and again.extra == {"seconds": 40.25, "over": True, "with_run": False}
    assert again.what == "rank 0 was in `wait_for_lost_shard` (train.py:12) for 40 s", again.what


def test_a_run_that_ends_while_stalled_says_how_long_it_had_stalled():
    journaled, state = [], ["running"]
    collector = _collector(journaled, state)
    _stalled_at(collector, journaled, 7, time.time() - 50)
    state[0] = "crashed"
    collector.collect([])
    (end, said), (again, _) = journaled[2:]
    assert end.ended and end.with_run and 50 <= end.seconds < 80, end
    assert said.startswith("the stall at step 7 is over after 5") and said.endswith("the run ended while stalled")
    assert again.extra["over"] and again.what.endswith("for %.0f s; the run ended while stalled" % end.seconds)
    collector.collect([])
    assert len(journaled) == 4  # over once


def test_a_stall_over_before_its_stacks_came_is_journaled_after_its_start():
    journaled, state, gate = [], ["running"], threading.Event()

    def slow() -> list:
        gate.wait(30)
        return [_rank(0, SPIN)]

    collector = _collector(journaled, state, slow)
    said: list = []
    collector._on_stall = said.append  # what run.json is told: the stall, then its end
    collector.collect([[3, 500.0, {"loss": 1.0}]])
    time.sleep(0.2)
    collector.collect([])
    collector.collect([[4, 512.0, {"loss": 1.0}]])  # over while the stacks are being taken
    assert journaled == [] and collector.stalled is None and said == [None]
    gate.set()
    _wait(journaled, 4)
    kinds = [(type(w).__name__, getattr(w, "ended", None)) for w, _ in journaled]
    assert kinds == [("Stall", False), ("Finding", None), ("Stall", True), ("Finding", None)], kinds
    assert journaled[2][0].seconds == 12.0 and collector.stalled is None and said == [None]  # never stalled again
    assert journaled[3][0].what == "rank 0 was in `wait_for_lost_shard` (train.py:12) for 12 s"


def test_without_stacks_the_stall_is_named_as_before():
    journaled: list = []
    collector = RankCollector(None, lambda msg: None, lambda what, message: journaled.append((what, message)),
                              lambda: "running", stall_seconds=0.05)
    collector.collect([[5, 1.0, {"loss": 1.0}]])
    time.sleep(0.2)
    collector.collect([])
    ((stall, text),) = journaled
    assert text == "no rank made a step for 0 s (all at step 5)" and stall.stacks == () and stall.where == ""


def test_a_rank_whose_reports_stopped_behind_is_named_by_its_last_report_at_the_step_the_run_stands(tmp_path):
    # Rank 1's flusher got no GIL from step 2 on (C code held it) while DDP's lockstep took
    # both ranks to step 9: the stall is at step 9, rank 1's step 1 is its last report, not
    # where it is; its late report of steps 2-9 does not end the stall, its step 10 does.
    journaled, state = [], ["running"]
    silent = RankStacks(rank=1, pid=7, step=1, answered=False, state="R (running)", note="no answer").to_data()
    collector = _collector(journaled, state, lambda: [_rank(0, *WAIT), silent])
    collector._store = StoreWriter(tmp_path / "metrics.db")  # where rank 1's rows go
    collector.receive(1, {"rows": [[1, 0.5, {"loss": 1.0}]]})
    _stalled_at(collector, journaled, 9, 1.0)
    stall, text = journaled[0]
    assert stall.step == 9 and stall.ranks == (1,), stall
    assert text.startswith("rank 1 stalled: no step reported for 0 s (the last at step 1); the others wait for it "
                           "at step 9: rank 1: its interpreter did not answer; process R (running) "
                           "(last reported step 1); rank 0 waited in `loss.backward()`"), text
    collector.receive(1, {"rows": [[s, 0.5 + s / 100, {"loss": 1.0}] for s in range(2, 10)]})
    collector.collect([])
    assert collector.stalled == text and len(journaled) == 2  # not over: steps from before it
    collector.receive(1, {"rows": [[10, 5.0, {"loss": 1.0}]]})
    collector.collect([])
    collector.collect([])
    end = journaled[2][0]
    assert isinstance(end, events.Stall) and end.ended and end.step == 9 and end.seconds == 4.0, end
    assert collector.stalled is None
