"""This process's part in a multi-rank run: who it is, and how it agrees with the others.

A rank's identity and the world size come from the process group once the script has
initialised it (``dist.get_rank()``), not from the environment at start: a framework may
set ``RANK`` only after ptdash started, or never (``mp.spawn`` passes the rank as an
argument). Until then a process counts as rank 0 of 1.

Commands reach every rank at the same step through the hub (hub.py): in this process
when it is the hub, over the rank link (link.py) otherwise. The exchange is a round trip
on a Unix socket, never a collective on the script's process group, so it touches
neither the GPU nor the script's NCCL communicator, and nothing goes through the job's
TCP store.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable

import torch.distributed as dist

from .link import HubBusy, HubNotListening, Link, LinkError, describe
from .shared import events
from .shared.protocol import Command, Message
from .shared.wire import to_dict

log = logging.getLogger("ptdash.distributed")

HUB_WAIT_SECONDS = 120.0
"""How long a rank keeps trying to reach a hub that does not listen yet. Under torchrun every
rank's engine starts at once and rank 0's (the hub) may open its socket after the others try:
they wait for it instead of training without ptdash."""

SETUP_WAIT_SECONDS = 30.0
"""How long the first step waits for the rank link still being made. The hub listens by then
(rank 0's engine starts before its script, and a step follows collectives with rank 0), so
only a hub that is gone makes it wait this long."""

_RETRY_SECONDS = 0.05


def verdict(votes) -> list | None:
    """The rollback verdict of a round, from every rank's vote ``[why or None, good through,
    first bad step or None]`` (rollback.py), the same on every rank: the first reason any rank
    gave and the earliest bad step (every rank rolls back), and the lowest step every rank
    found sound (every rank may keep a snapshot up to it). None when no rank voted."""
    if not isinstance(votes, list):
        return None
    votes = [v for v in votes if isinstance(v, list) and len(v) == 3]
    if not votes:
        return None

    def steps(i: int) -> list[int]:
        return [v[i] for v in votes if isinstance(v[i], int) and not isinstance(v[i], bool)]

    whys = sorted(str(v[0]) for v in votes if v[0])
    good = steps(1)
    return [whys[0] if whys else None, min(good) if len(good) == len(votes) else None, min(steps(2), default=None)]


def env_rank() -> tuple[int, int, int]:
    """``(rank, local_rank, world_size)`` as a launcher set them (0, 0, 1 when alone)."""
    return (int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0)),
            int(os.environ.get("WORLD_SIZE", 1)))


def group_rank() -> tuple[int, int] | None:
    """``(rank, world_size)`` of the script's initialised default process group, or None."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return None


class Distributed:
    """Identity, the hub connection and the command exchange of this process.

    ``hub`` is the Hub when this process is the hub; otherwise ``link_path`` (the hub's
    Unix socket, or ``(host, port, key)`` of its TCP port for a rank on another node) and
    ``token`` say how to reach it; ``hello`` is what such a rank says of itself.
    """

    def __init__(self, hub=None, link_path=None, token: str = "", hello: dict | None = None) -> None:
        self.rank, self.local_rank, self.world_size = env_rank()
        self.hub = hub
        self._link_path, self._token, self._hello = link_path, token, hello
        self.link: Link | None = None
        self._connecting: threading.Thread | None = None
        self._link_error: LinkError | None = None
        self._closing = False
        self.channel = False
        """Whether this rank takes part in command exchanges."""
        self.missing: list[int] = []
        self.next_exchange = 0
        self.exchanges = 0
        self.exchange_seconds = 0.0
        """Time spent in command exchanges outside pauses, to report their cost per step."""
        self._last_cost = 0.0
        self.answer_stacks: Callable[[], dict] | None = None
        """This process's stacks (stacks.StackTaker.take), for the hub's requests."""
        self.verdict: list | None = None
        """The rollback verdict of the newest exchange (``[why or None, good through]``), or None."""
        self.identify()

    @property
    def multi(self) -> bool:
        return self.world_size > 1

    @property
    def ready(self) -> bool:
        return self.channel

    def identify(self) -> None:
        """Take rank and world size from the process group, once the script made it."""
        found = group_rank()
        if found is not None:
            self.rank, self.world_size = found
            self.local_rank = int(os.environ.get("LOCAL_RANK", self.local_rank))

    def connect(self) -> None:
        """A rank in another process than the hub: register over the rank link, from a thread of
        its own that waits for a hub not listening yet (``HUB_WAIT_SECONDS``); the script starts
        meanwhile, and ``setup`` waits for the link at the first step."""
        if self.hub is not None or self._connecting is not None or self._link_path is None:
            return
        self.identify()
        self._connecting = threading.Thread(target=self._connect, name="ptdash-link-connect", daemon=True)
        self._connecting.start()

    def _connect(self) -> None:
        deadline = time.monotonic() + HUB_WAIT_SECONDS
        while not self._closing:
            try:
                self.link = Link(self._link_path, self._token, self.rank, self.world_size, self._hello,
                                 answer=self._answer)
                return
            except (HubNotListening, HubBusy) as exc:  # not up yet, or its port held by a flood
                if time.monotonic() > deadline:
                    self._link_error = exc
                    return
            except LinkError as exc:  # the hub refused this rank: trying again changes nothing
                self._link_error = exc
                return
            time.sleep(_RETRY_SECONDS)

    def _answer(self, frame: dict) -> dict | None:
        """The hub asks for this process's stacks (the link's reader thread)."""
        if "stacks" in frame and self.answer_stacks is not None:
            return {"stacks": frame["stacks"], "result": self.answer_stacks()}
        return None

    def wait_link(self) -> bool:
        """Whether the rank link is up, once its connection is made or has failed (training thread)."""
        if self._connecting is None:
            self.connect()
        self._connecting.join(SETUP_WAIT_SECONDS)
        if self.link is None:
            # Another host, or a hub that is gone: train on, without reporting.
            exc = self._link_error or LinkError(f"no answer from the ptdash hub at {describe(self._link_path)} "
                                                f"in {SETUP_WAIT_SECONDS:.0f} s")
            log.warning("%s", exc)
            print(f"ptdash: rank {self.rank} runs without ptdash: {exc}", flush=True)
        return self.link is not None

    def setup(self) -> bool:
        """At the first step (every rank): join the command exchange if the hub says all ranks can.

        False when alone, or when the script never initialised torch.distributed (then
        every process is its own run, e.g. independent jobs launched side by side).
        """
        self.identify()
        if not self.multi or group_rank() is None:
            return False
        if self.hub is not None:
            error = self.hub.register(self.rank, self.world_size, os.getpid(), local=True)
            if error:
                log.warning("hub refused this rank: %s", error)
                return False
            self.channel, self.missing = self.hub.channel(self.rank)
        else:
            if self._link_path is None or not self.wait_link():
                return False
            try:
                answer = self.link.request({"channel": True})
            except (OSError, LinkError) as exc:
                log.warning("rank link: %s", exc)
                return False
            self.channel, self.missing = bool(answer.get("channel")), list(answer.get("missing") or [])
        return self.channel

    # ------------------------------------------------- commands (training thread)

    def due(self, step: int) -> bool:
        return self.channel and step >= self.next_exchange

    def exchange(self, step: int, step_seconds: float, hold: bool = False, barrier: bool = False,
                 vote: list | None = None) -> list[Command]:
        """One round with every other rank: the same commands come back to each.

        ``hold``: this rank is paused (the hub waits a moment for a command before it lets
        the round go). ``barrier``: a round that only waits for the others. ``vote``: this
        rank's word on rolling back (rollback.py); the round's verdict, the same for every
        rank, is left in ``verdict``.
        """
        t0 = time.perf_counter()
        self.verdict = None
        if self.hub is not None:
            commands, next_step, votes = self.hub.exchange(self.rank, step, step_seconds, self._last_cost,
                                                           hold, barrier, vote)
            self.verdict = verdict(votes)
        else:
            try:
                answer = self.link.request({"arrive": step, "s": step_seconds, "cost": self._last_cost,
                                            "hold": hold, "barrier": barrier, "vote": vote})
            except (OSError, LinkError) as exc:
                # The hub is gone: no more commands; training goes on.
                log.warning("rank link: %s; no more commands reach this rank", exc)
                self.channel = False
                return []
            commands = [Command(id=i or "", name=n, value=v) for i, n, v in answer["commands"]]
            next_step = int(answer["next"])
            self.verdict = verdict(answer.get("votes"))
        elapsed = time.perf_counter() - t0
        if not hold:
            self._last_cost = elapsed
            self.exchange_seconds += elapsed
            self.exchanges += 1
        if not barrier:
            self.next_exchange = next_step
        return commands

    def cost_note(self, steps: int) -> tuple[events.RunNote, str]:
        """The event that says what the command exchanges cost over a run of ``steps`` steps."""
        return (events.RunNote(exchanges=self.exchanges, seconds=self.exchange_seconds, steps=steps),
                f"rank channel: {self.exchanges} command exchanges over {steps} steps, "
                f"{self.exchange_seconds / self.exchanges * 1e3:.2f} ms each, "
                f"{self.exchange_seconds / steps * 1e6:.0f} us per step on average")

    def barrier(self) -> None:
        if self.channel:
            self.exchange(self.next_exchange, 0.0, barrier=True)

    # ---------------------------------------------------- data (flusher thread)

    def push(self, payload: dict) -> None:
        """Another process than the hub: hand one flush's rows, events and readings to it."""
        if self.link is not None:
            self.link.post({"push": payload})

    def publish(self, msg: Message) -> None:
        """Rank 0 in another process than the hub: what it tells the dashboards goes through the hub."""
        if self.link is not None:
            self.link.post({"publish": to_dict(msg)})

    def close(self) -> None:
        self._closing = True
        if self._connecting is not None:
            self._connecting.join(1.0)
        if self.link is not None:
            self.link.post({"bye": True})
            self.link.close()
            self.link = None

    def local_pids(self) -> list[int]:
        """Pids of the ranks in other processes (for an immediate kill), as the kernel named them."""
        return self.hub.pids() if self.hub is not None else []
