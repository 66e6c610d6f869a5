"""The hub's stall detector takes every rank's stacks when it names a stall (ranks.RankCollector):
the stall is named by them when step counts cannot tell, kept with the event, and each stall
is a doctor finding of its own."""

from __future__ import annotations

import time

from ptdash.ranks import RankCollector
from ptdash.shared import events
from ptdash.shared.stacks import Frame, RankStacks, Thread

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
    collector.collect([[31, 3.0, {"loss": 1.0}]])
    collector._progress[1] = collector._progress[0]
    time.sleep(0.2)
    collector.collect([])
    _wait(journaled, 5)
    assert journaled[4][0].case == "step 31"  # another stall, another finding


def test_without_stacks_the_stall_is_named_as_before():
    journaled: list = []
    collector = RankCollector(None, lambda msg: None, lambda what, message: journaled.append((what, message)),
                              lambda: "running", stall_seconds=0.05)
    collector.collect([[5, 1.0, {"loss": 1.0}]])
    time.sleep(0.2)
    collector.collect([])
    ((stall, text),) = journaled
    assert text == "no rank made a step for 0 s (all at step 5)" and stall.stacks == () and stall.where == ""
