"""The hub and the rank link over real Unix sockets, with ranks as threads: registration,
the channel decision, exchange rounds, a paused round held for a command, and a rank
that goes away."""

from __future__ import annotations

import collections
import os
import socket
import tempfile
import threading
from pathlib import Path

import pytest

from ptdash import hub as hub_module
from ptdash.distributed import Distributed
from ptdash.hub import Hub, spacing_steps
from ptdash.link import Link, LinkError
from ptdash.shared.protocol import Command
from support.journaled import journaled

TOKEN = "t" * 64


class Inbox:
    def __init__(self) -> None:
        self.commands: collections.deque[Command] = collections.deque()
        self.events: list[tuple[str, str]] = []
        self.data: list[tuple[int, dict]] = []

    def take(self, n: int) -> list[Command]:
        out = []
        while self.commands and len(out) < n:
            out.append(self.commands.popleft())
        return out


def _new_hub() -> Hub:
    """A hub in a private folder of its own, not listening yet."""
    folder = Path(tempfile.mkdtemp(prefix="ptd-hub-"))
    os.chmod(folder, 0o700)
    inbox = Inbox()
    h = Hub(folder / "run-ranks.sock", TOKEN, inbox.take, lambda: len(inbox.commands),
            lambda rank, payload: inbox.data.append((rank, payload)), lambda rank, msg: None,
            journaled(lambda kind, message, data: inbox.events.append((kind, message))))
    h.inbox = inbox
    return h


@pytest.fixture
def hub():
    h = _new_hub()
    h.start()
    yield h
    h.stop()


def _in_thread(fn, *args):
    result = {}

    def run():
        try:
            result["value"] = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - reraised in the test's thread
            result["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread, result


def test_spacing_every_step_until_a_step_time_is_known_then_about_half_a_second_at_most():
    assert spacing_steps(0.0, 0.0) == 1
    assert spacing_steps(float("nan"), 0.0) == 1
    assert spacing_steps(2.0, 1e-4) == 1  # slow steps: every step
    assert spacing_steps(0.02, 1e-4) == 2  # 50 ms apart while the exchange is cheap
    assert spacing_steps(0.001, 1e-3) == 200  # a 1 ms exchange: 0.2 s apart keeps it under 0.5%
    assert spacing_steps(0.001, 1.0) == 500  # never more than 0.5 s apart, whatever it costs
    assert spacing_steps(1e-6, 1.0) == hub_module.MAX_EVERY


def test_two_ranks_get_the_same_commands_at_the_same_round(hub):
    links = [Link(hub.path, TOKEN, rank, 2) for rank in (0, 1)]
    try:
        assert sorted(hub.rank_pids()) == [0, 1] and set(hub.rank_pids().values()) == {os.getpid()}
        answers = [_in_thread(link.request, {"channel": True}) for link in links]
        for thread, _ in answers:
            thread.join(30)
        assert [r["value"] for _, r in answers] == [{"channel": True, "missing": []}] * 2
        assert ("run", "rank channel up: 2 ranks") in hub.inbox.events

        hub.inbox.commands.extend([Command("a1", "clip", 0.5), Command("b2", "pause")])
        rounds = [_in_thread(link.request, {"arrive": 7, "s": 0.02, "cost": 1e-4}) for link in links]
        for thread, _ in rounds:
            thread.join(30)
        zero, one = (r["value"] for _, r in rounds)
        assert zero == {"commands": [["a1", "clip", 0.5], ["b2", "pause", None]], "next": 9}
        assert one == {"commands": [["", "clip", 0.5], ["", "pause", None]], "next": 9}  # ids answer on rank 0

        # The next round hands out nothing, and only when both ranks are in.
        first, result = _in_thread(links[0].request, {"arrive": 9, "s": 0.02})
        first.join(0.3)
        assert first.is_alive()  # rank 1 has not arrived
        assert links[1].request({"arrive": 9, "s": 0.02})["commands"] == []
        first.join(30)
        assert result["value"]["commands"] == []
    finally:
        for link in links:
            link.close()


def test_a_paused_round_waits_for_a_command_and_takes_it_at_once(hub, monkeypatch):
    monkeypatch.setattr(hub_module, "HOLD_SECONDS", 60.0)  # only a command ends this round
    links = [Link(hub.path, TOKEN, rank, 2) for rank in (0, 1)]
    try:
        for thread, _ in [_in_thread(link.request, {"channel": True}) for link in links]:
            thread.join(30)
        rounds = [_in_thread(link.request, {"arrive": 3, "hold": True}) for link in links]
        for _ in range(3000):
            if len(hub._arrived) == 2:
                break
            threading.Event().wait(0.01)
        assert all(t.is_alive() for t, _ in rounds)  # both in, held open: no command yet
        hub.inbox.commands.append(Command("r", "resume"))
        hub.wake()
        for thread, _ in rounds:
            thread.join(30)
        assert [r["value"]["commands"][0][1] for _, r in rounds] == ["resume", "resume"]
    finally:
        for link in links:
            link.close()


def test_a_rank_that_never_comes_is_named_and_only_rank_0_exchanges(hub, monkeypatch):
    monkeypatch.setattr(hub_module, "CHANNEL_WAIT", 0.2)
    link = Link(hub.path, TOKEN, 0, 3)
    try:
        assert link.request({"channel": True}) == {"channel": True, "missing": [1, 2]}
        assert hub.partial == "ranks 1, 2 run without ptdash, so the change would reach some replicas and not the others"
        assert any(kind == "warning" and "ranks 1, 2 of 3 never reached ptdash" in message
                   for kind, message in hub.inbox.events)
        late = Link(hub.path, TOKEN, 1, 3)  # too late: the decision stands, for every rank
        try:
            assert late.request({"channel": True}) == {"channel": False, "missing": [1, 2]}
        finally:
            late.close()
        hub.inbox.commands.append(Command("p", "pause"))
        assert link.request({"arrive": 1})["commands"] == [["p", "pause", None]]  # alone, at once
    finally:
        link.close()


def test_a_rank_that_goes_away_does_not_hold_the_others(hub):
    links = [Link(hub.path, TOKEN, rank, 2) for rank in (0, 1)]
    for thread, _ in [_in_thread(link.request, {"channel": True}) for link in links]:
        thread.join(30)
    waiting, result = _in_thread(links[0].request, {"arrive": 5, "s": 0.1})
    waiting.join(0.3)
    assert waiting.is_alive()
    links[1].close()  # rank 1 exits
    waiting.join(30)
    assert result["value"]["commands"] == [] and hub.participants == frozenset({0})
    links[0].close()


def test_refusals_wrong_token_impossible_rank_other_world_and_a_stolen_rank(hub):
    with pytest.raises(LinkError, match="wrong token"):
        Link(hub.path, "x" * 64, 0, 2)
    with pytest.raises(LinkError, match="is not a rank"):
        Link(hub.path, TOKEN, 2, 2)
    link = Link(hub.path, TOKEN, 0, 2)
    try:
        with pytest.raises(LinkError, match="says the world has 4 ranks; the others said 2"):
            Link(hub.path, TOKEN, 1, 4)
        # The same rank from another process: the kernel's pid decides, not the message.
        assert hub.register(0, 2, os.getpid() + 1, local=False) == f"rank 0 is already registered by pid {os.getpid()}"
    finally:
        link.close()
    # Garbage is answered by closing, and the hub goes on serving.
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(hub.path))
    sock.sendall(b"\x00\x00\x00\x05hello")
    sock.settimeout(10)
    assert sock.recv(100) == b""
    sock.close()
    Link(hub.path, TOKEN, 1, 2).close()


def test_flushes_arrive_in_order_and_the_socket_is_private(hub):
    assert oct(os.stat(hub.path).st_mode & 0o777) == "0o600"
    link = Link(hub.path, TOKEN, 1, 2)
    for i in range(50):
        link.post({"push": {"rows": [[i, 0.0, {"loss": float(i)}]]}})
    link.close()  # sends what is queued first
    for _ in range(3000):
        if len(hub.inbox.data) == 50:
            break
        threading.Event().wait(0.01)
    assert [payload["rows"][0][0] for rank, payload in hub.inbox.data] == list(range(50))
    assert {rank for rank, _ in hub.inbox.data} == {1}


def test_a_rank_whose_engine_starts_before_the_hub_listens_waits_for_it(monkeypatch, capsys):
    # Under torchrun every rank's engine starts at once; rank 0's opens the hub's socket, maybe
    # after rank 1 first tries it. Here the hub starts strictly after the rank asked.
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    h = _new_hub()
    rank = Distributed(link_path=h.path, token=TOKEN)
    try:
        rank.connect()
        assert not h.path.exists()
        h.start()
        assert rank.wait_link()
        assert sorted(h.rank_pids()) == [1]
        assert "without ptdash" not in capsys.readouterr().out
    finally:
        rank.close()
        h.stop()


def test_a_rank_the_hub_refuses_says_so_once_at_its_first_step_and_trains_on(hub, monkeypatch, capsys):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    rank = Distributed(link_path=hub.path, token="x" * 64)
    try:
        rank.connect()
        assert capsys.readouterr().out == ""  # nothing said while the script starts
        assert not rank.wait_link()
        out = capsys.readouterr().out
        assert out.count("rank 1 runs without ptdash") == 1 and "wrong token" in out
        assert hub.rank_pids() == {}
    finally:
        rank.close()


def test_ranks_of_a_large_job_flush_less_often_so_that_the_hub_keeps_up():
    from ptdash.flusher import INTERVAL_S
    from ptdash.ranks import FLUSH_COST_S, HUB_SHARE, push_interval

    assert push_interval(1) == 0 and push_interval(16) < INTERVAL_S  # small jobs: as before
    assert push_interval(1000) == pytest.approx(999 * FLUSH_COST_S / HUB_SHARE)
    # the other ranks' flushes then cost the hub HUB_SHARE of a core at most, however many
    for world in (64, 1000, 10000):
        assert (world - 1) / max(INTERVAL_S, push_interval(world)) * FLUSH_COST_S <= HUB_SHARE + 1e-9
    from ptdash.flusher import Flusher

    flusher = Flusher(None, None, None, None, None, None, lambda msg: None, push=lambda payload: None)
    assert flusher.wait_s() == INTERVAL_S
    flusher.floor = push_interval(1000)
    assert flusher.wait_s() == pytest.approx(push_interval(1000))  # beyond the usual 1 s cap too
