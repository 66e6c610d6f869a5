"""The hub gathers ranks' stacks over real rank links (Unix sockets, ranks as threads): each
rank's link thread answers, a rank that does not is named with its state, and a rank in the
hub's own process is taken there."""

from __future__ import annotations

import os
import threading
import time

import pytest

from ptdash.link import Link
from ptdash.shared.protocol import Stacks
from ptdash.shared.stacks import read
from ptdash.stackgather import StackGatherer
from unit.test_hub import TOKEN, _new_hub


@pytest.fixture
def hub():
    h = _new_hub()
    h.start()
    yield h
    h.stop()


class Collector:
    def steps(self) -> dict[int, int]:
        return {0: 40, 1: 38, 2: 17}


class Controls:
    on_stacks = None


def _answer(rank: int, calls: list):
    def answer(frame: dict) -> dict | None:
        calls.append(threading.current_thread().name)
        return {"stacks": frame["stacks"], "result": {"rank": 99, "step": 30 + rank, "pid": os.getpid(),
                                                        "threads": [{"name": "MainThread", "training": True}]}}
    return answer


def test_every_rank_answers_from_its_link_thread_and_a_silent_one_is_named(hub):
    calls: list[str] = []
    links = [Link(hub.path, TOKEN, 1, 3, answer=_answer(1, calls)),
             Link(hub.path, TOKEN, 2, 3, answer=lambda frame: None)]  # rank 2's interpreter never answers
    published = []
    try:
        hub.register(0, 3, os.getpid(), local=True)
        ranks, controls = Collector(), Controls()
        gatherer = StackGatherer(hub, lambda: {"rank": 0, "step": 40, "pid": os.getpid()}, published.append,
                                 ranks, controls)
        assert ranks.stacks == gatherer.gather and controls.on_stacks == gatherer.request
        deadline = time.monotonic() + 60
        while sum(i.connections for i in hub.rank_infos() if not i.local) < 4 and time.monotonic() < deadline:
            time.sleep(0.02)  # both links up (each has two connections) before the hub asks
        # Rank 1's link thread answers at once, on a loaded machine too; rank 2 is named after 5 s.
        started = time.monotonic()
        zero, one, two = read(gatherer.gather(timeout=5.0))
        assert time.monotonic() - started < 30
        assert zero.answered and zero.step == 40
        assert one.answered and one.rank == 1 and one.step == 31  # its own count, and its rank as the hub knows it
        assert calls == ["ptdash-link-read"]  # the link's reader thread, never the training thread
        assert not two.answered and two.step == 17 and two.pid == os.getpid()
        assert "no answer in 5 s" in two.note and two.state  # this process's /proc state
        gatherer.request("c1")
        deadline = time.monotonic() + 30
        while not published and time.monotonic() < deadline:
            time.sleep(0.05)
        (msg,) = published
        assert isinstance(msg, Stacks) and msg.id == "c1" and [r["rank"] for r in msg.ranks] == [0, 1, 2]
    finally:
        for link in links:
            link.close()


def test_one_process_gathers_its_own():
    class NoRanks:
        def rank_infos(self):
            return []

    gatherer = StackGatherer(NoRanks(), lambda: {"rank": 0, "step": 3}, lambda msg: None, Collector(), Controls())
    (only,) = read(gatherer.gather())
    assert only.rank == 0 and only.step == 3 and only.answered
