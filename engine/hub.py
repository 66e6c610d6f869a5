"""The hub: the process ptdash started, to which every training rank reports.

It owns the run dir, the store, run.json and the dashboards' socket, whether it trains
itself (one process, or rank 0 under torchrun, or the process a framework turns into
rank 0) or only launches the ranks (``mp.spawn``). It also owns the command inbox, and
the ranks agree on commands through it:

- **Registration.** A rank says who it is (its rank and world size, from the process
  group) when its engine starts; the hub learns its pid from the kernel (SO_PEERCRED).
- **The channel decision.** At its first step every rank asks whether the ranks can
  agree on commands. The hub answers once for all: yes when every rank of the world has
  registered; otherwise no, naming the ranks it never heard from. Without the channel
  only rank 0 applies commands, and commands that would change one replica and not the
  others (clip, LR) are refused with that reason.
- **The exchange.** At agreed steps each rank arrives with its step; when all have, the
  hub hands every one the same commands and the step of the next exchange. That step is
  chosen from the slowest rank's step time so that a command waits at most about
  ``MAX_SPACING_SECONDS`` plus one step, and exchanges cost under ``EXCHANGE_SHARE`` of
  the time; before any step time is known the ranks exchange at every step. While
  paused, the hub holds the exchange open until a command comes (or half a second), so a
  resume takes effect at once and no collective of the script times out.

Ranks in this process call the hub, the others use the rank link (link.py); never the TCP store.
"""

from __future__ import annotations

import logging
import math
import socket
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from . import link
from .rankserve import UnixRankListener
from .shared import events
from .shared.protocol import Command

log = logging.getLogger("ptdash.hub")

EXCHANGE_SECONDS = 0.05
"""At most one command exchange per this many seconds of training..."""

EXCHANGE_SHARE = 0.005
"""...and no more often than keeps their measured cost under this share of the time..."""

MAX_SPACING_SECONDS = 0.5
"""...but at least one per this many seconds, which bounds a command's wait."""

MAX_EVERY = 1000
"""Steps between exchanges at most, however fast the steps."""

MAX_COMMANDS = 8
"""Commands handed out per exchange; more wait for the next one."""

CHANNEL_WAIT = 10.0
"""Seconds the channel decision waits for ranks that have not registered yet."""

HOLD_SECONDS = 0.5
"""While paused, how long an exchange waits for a command before it lets the ranks go round."""


@dataclass
class RankInfo:
    rank: int
    pid: int
    local: bool
    """In the hub's own process."""
    connections: int = 0
    """Open link connections (a rank in another process has two)."""
    step: int | None = None
    """The step of its newest exchange."""
    ended: bool = False
    """It said goodbye (its engine finished)."""
    host: str = ""
    """The host of a rank on another node ("" on this machine)."""
    node: int = 0


def spacing_steps(step_seconds: float, cost_seconds: float) -> int:
    """Steps until the next exchange: 1 while no step time is known; else as many as fit in
    the spacing that keeps the exchange's cost under its share, at most MAX_SPACING_SECONDS."""
    if not step_seconds or step_seconds <= 0 or not math.isfinite(step_seconds):
        return 1
    spacing = min(MAX_SPACING_SECONDS, max(EXCHANGE_SECONDS, cost_seconds / EXCHANGE_SHARE))
    return max(1, min(MAX_EVERY, int(spacing / step_seconds)))


class Hub:
    """Registration, the channel decision and the command exchange (see the module docstring).

    ``take_commands(n)`` pops up to n queued commands, ``queued()`` counts them; ``on_data(rank,
    payload)`` takes what a rank's flusher sent; ``on_publish(rank, msg)`` takes a message rank 0
    publishes (status, acks, live layer records) when rank 0 is in another process; ``event(data,
    message)`` journals (events.py).
    """

    def __init__(self, path: Path, token: str, take_commands: Callable[[int], list[Command]],
                 queued: Callable[[], int], on_data: Callable[[int, dict], None],
                 on_publish: Callable[[int, dict], None], event: Callable[..., object]) -> None:
        self.path = Path(path)
        self.host = socket.gethostname()
        self._token = token
        self._take, self._queued = take_commands, queued
        self._on_data, self._on_publish, self._event = on_data, on_publish, event
        self._cond = threading.Condition()
        self.ranks: dict[int, RankInfo] = {}
        self.world: int | None = None
        self.participants: frozenset[int] | None = None
        """The ranks that exchange commands, once decided (all, or rank 0 alone)."""
        self.missing: list[int] = []
        """Ranks never registered when the channel was decided."""
        self._arrived: dict[int, tuple] = {}
        self._round = 0
        self._releasing = False
        self._result: tuple[list[Command], int, list | None] = ([], 0, None)
        self._costs: list[float] = []
        self._listener: UnixRankListener | None = None
        self._closing = False
        self.exchanges = 0
        self.lost_nodes: dict[int, dict] = {}
        """Node -> ``{"node", "host", "ranks"}`` of the nodes that were lost."""
        self._data_conns: dict[int, tuple[link.Conn, threading.Lock]] = {}
        self.on_stacks: Callable[[int, dict], None] = lambda rank, frame: None
        """A rank's answer to ``ask(rank, {"stacks": n})`` (stackgather.py)."""

    # ------------------------------------------------------------------ listening

    def start(self) -> None:
        """Listen on the rank socket (rankserve.py)."""
        self._listener = UnixRankListener(self.path, self._token, self.serve_rank, lambda: self._closing)
        self._listener.start()

    def stop(self) -> None:
        self._closing = True
        with self._cond:
            self._cond.notify_all()
        if self._listener is not None:
            self._listener.stop()

    def serve_rank(self, conn: link.Conn, hello: dict, pid: int, host: str = "", node: int = 0) -> None:
        """Register the rank a hello names and serve its connection until it closes (its own
        thread). ``host`` and ``node``: where a rank on another node is (nodeport.py)."""
        rank = None
        try:
            rank, world, role = hello.get("rank"), hello.get("world"), hello.get("hello")
            error = self.register(rank, world, pid, local=False, host=host, node=node)
            if error:
                rank = None
                conn.send({"ok": False, "error": error})
                return
            conn.send({"ok": True})
            conn.settimeout(None)
            if role == "control":
                self._serve_control(conn, rank)
            else:
                self._serve_data(conn, rank)
        except (OSError, ValueError) as exc:
            if not self._closing:
                log.warning("rank link of rank %s: %s", rank, exc)
        finally:
            conn.close()
            if rank is not None:
                self._disconnected(rank)

    def _serve_control(self, conn: link.Conn, rank: int) -> None:
        while (request := conn.recv()) is not None:
            if "channel" in request:
                ok, missing = self.channel(rank)
                conn.send({"channel": ok, "missing": missing})
            elif "arrive" in request:
                commands, next_step, verdict = self.exchange(
                    rank, int(request["arrive"]), float(request.get("s") or 0.0), float(request.get("cost") or 0.0),
                    bool(request.get("hold")), bool(request.get("barrier")), request.get("vote"))
                conn.send({"commands": [[c.id, c.name, c.value] for c in commands], "next": next_step,
                           **({"votes": verdict} if verdict is not None else {})})  # votes: rollback.py
            else:
                raise ValueError(f"unknown request {sorted(request)[:3]}")

    def _serve_data(self, conn: link.Conn, rank: int) -> None:
        with self._cond:
            self._data_conns[rank] = (conn, threading.Lock())
        try:
            self._read_data(conn, rank)
        finally:
            with self._cond:
                if self._data_conns.get(rank, (None,))[0] is conn:
                    del self._data_conns[rank]

    def ask(self, rank: int, obj: dict) -> bool:
        """Send ``obj`` to a rank on its data connection (its link thread answers); False if none."""
        with self._cond:
            found = self._data_conns.get(rank)
        if found is None:
            return False
        conn, lock = found
        try:
            with lock:
                conn.send(obj)
        except (OSError, ValueError) as exc:
            log.warning("rank link of rank %d: %s", rank, exc)
            return False
        return True

    def _read_data(self, conn: link.Conn, rank: int) -> None:
        while (frame := conn.recv()) is not None:
            if "stacks" in frame:
                self.on_stacks(rank, frame)
            elif "push" in frame:
                self._on_data(rank, frame["push"])
            elif "publish" in frame and rank == 0:
                self._on_publish(rank, frame["publish"])
            elif "bye" in frame:
                with self._cond:
                    self.ranks[rank].ended = True

    # ------------------------------------------------------------------ registry

    def register(self, rank, world, pid: int, local: bool, host: str = "", node: int = 0) -> str | None:
        """Record a rank's connection; an error message when it does not fit the job."""
        if not isinstance(rank, int) or not isinstance(world, int) or not 0 <= rank < world:
            return f"rank {rank!r} of world {world!r} is not a rank"
        with self._cond:
            if self.world is None:
                self.world = world
            elif world != self.world:
                return f"rank {rank} says the world has {world} ranks; the others said {self.world}"
            info = self.ranks.get(rank)
            if info is not None and (info.host, info.pid) != (host, pid):
                where = f" on {info.host}" if info.host else ""
                return f"rank {rank} is already registered by pid {info.pid}{where}"
            if info is None:
                info = self.ranks[rank] = RankInfo(rank, pid, local, host=host, node=node)
            info.connections += 1
            self._cond.notify_all()
        return None

    def _disconnected(self, rank: int) -> None:
        with self._cond:
            info = self.ranks.get(rank)
            if info is None:
                return
            info.connections -= 1
            if info.connections <= 0 and self.participants is not None and rank in self.participants:
                # A rank that is gone never arrives: the others must not wait for it.
                self.participants = self.participants - {rank}
                self._release_if_complete()
            if info.connections <= 0 and info.host and not info.ended and not self._closing:
                ranks = [i for i in self.ranks.values() if i.node == info.node]
                if all(i.connections <= 0 and not i.ended for i in ranks):
                    self.node_lost(info.node, info.host, "every rank's link closed without a goodbye "
                                   "(killed, or the network cut)")
            self._cond.notify_all()

    def node_lost(self, node: int, host: str, why: str) -> None:
        """Name a node that is gone, with its ranks (once)."""
        with self._cond:
            infos = [i for i in self.ranks.values() if i.node == node and i.host]
            if self._closing or node in self.lost_nodes or (infos and all(i.ended for i in infos)):
                return  # the hub is ending, or every rank there ended: nothing was lost
            ranks = sorted(i.rank for i in infos)
            self.lost_nodes[node] = {"node": node, "host": host, "ranks": ranks}
            who = f"rank{'s' if len(ranks) != 1 else ''} {', '.join(map(str, ranks))}" if ranks else "no rank known"
            self._event(events.Node(node=node, host=host, ranks=tuple(ranks), lost=True, why=why),
                        f"node {node} ({host}) lost, with {who}: {why}", info={"lost_nodes": list(self.lost_nodes.values())})

    def wait_ranks_gone(self, timeout: float) -> bool:
        """Wait (at most ``timeout`` s) until every rank in another process has closed its
        link: its last flush is then in. False if some are still connected."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while any(not info.local and info.connections > 0 for info in self.ranks.values()):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def rank_pids(self) -> dict[int, int]:
        """Rank -> pid of the ranks on this machine, as the kernel named them (this process's
        own pid for a rank in it)."""
        with self._cond:
            return {rank: info.pid for rank, info in self.ranks.items() if not info.host}

    def rank_infos(self) -> list[RankInfo]:
        """A copy of every registered rank's entry, by rank."""
        with self._cond:
            return [replace(info) for _, info in sorted(self.ranks.items())]

    def pids(self) -> list[int]:
        """Pids of the ranks in other processes on this machine, as the kernel named them."""
        with self._cond:
            return [info.pid for info in self.ranks.values() if not info.local and not info.host]

    def hosts(self) -> dict[int, str]:
        """Rank -> host of every rank, this machine's named ``here``."""
        with self._cond:
            return {rank: info.host or self.host for rank, info in sorted(self.ranks.items())}

    # ------------------------------------------------------------------ channel

    def channel(self, rank: int) -> tuple[bool, list[int]]:
        """Whether the ranks exchange commands (the same answer for every rank), and who is missing."""
        with self._cond:
            if self.participants is None:
                deadline = time.monotonic() + CHANNEL_WAIT
                while self.world is not None and len(self.ranks) < self.world and not self._closing:
                    left = deadline - time.monotonic()
                    if left <= 0 or self.participants is not None:
                        break
                    self._cond.wait(left)
            if self.participants is None:
                world = self.world or 1
                self.missing = [r for r in range(world) if r not in self.ranks]
                self.participants = frozenset(range(world)) if not self.missing else frozenset({0})
                if not self.missing:
                    hosts = {str(r): i.host or self.host for r, i in sorted(self.ranks.items())}
                    count = len(set(hosts.values()))
                    self._event(events.RunNote(world=world, hosts=hosts),
                                f"rank channel up: {world} ranks" + (f" on {count} hosts" if count > 1 else ""),
                                info={"world_size": world, "hosts": hosts})
                else:
                    self._event(events.Warned(missing=tuple(self.missing)),
                                f"rank{'s' if len(self.missing) > 1 else ''} "
                                f"{', '.join(map(str, self.missing))} of {world} never reached ptdash "
                                "(started without it?): commands reach rank 0 only, and clip and LR changes "
                                "are refused so that the replicas cannot diverge")
            return rank in self.participants, list(self.missing)

    @property
    def partial(self) -> str | None:
        """Why clip and LR changes are refused (some rank is not instrumented), or None."""
        if not self.missing:
            return None
        return (f"rank{'s' if len(self.missing) > 1 else ''} {', '.join(map(str, self.missing))} "
                "run without ptdash, so the change would reach some replicas and not the others")

    # ------------------------------------------------------------------ exchange

    def exchange(self, rank: int, step: int, step_seconds: float, cost: float, hold: bool,
                 barrier: bool = False, vote=None) -> tuple[list[Command], int, list | None]:
        """Wait until every participant arrived, then return the round's commands (the
        same for all), the step of the next exchange and every rank's ``vote`` (rollback.py).
        ``barrier``: a round that hands out no commands or votes (a checkpoint's barrier)."""
        with self._cond:
            participants = self.participants or frozenset({rank})
            if rank not in participants:
                return [], step + 1, None
            my_round = self._round
            self._arrived[rank] = (step, step_seconds, cost, hold, barrier, vote)
            info = self.ranks.get(rank)
            if info is not None:
                info.step = step
            if not self._release_if_complete():
                while self._round == my_round and not self._closing:
                    self._cond.wait(1.0)
            commands, next_step, verdict = self._result
        if rank != 0:
            commands = [Command(id="", name=c.name, value=c.value) for c in commands]
        return commands, next_step, verdict

    def _release_if_complete(self) -> bool:
        """With the lock held: release the round when every participant is in."""
        participants = self.participants or frozenset()
        if self._releasing or not self._arrived or not participants <= set(self._arrived):
            return False
        arrivals = list(self._arrived.values())
        barrier = any(a[4] for a in arrivals)
        commands: list[Command] = []
        if not barrier:
            commands = self._take(MAX_COMMANDS)
            if not commands and all(a[3] for a in arrivals):
                # Paused: hold the round open for a command, so that a resume is immediate.
                self._releasing = True
                try:
                    self._cond.wait_for(lambda: self._closing or self._queued() > 0, HOLD_SECONDS)
                finally:
                    self._releasing = False
                commands = self._take(MAX_COMMANDS)
        step = max(a[0] for a in arrivals)
        slowest = max(a[1] for a in arrivals)
        costs = [a[2] for a in arrivals if a[2] > 0]
        if costs:
            self._costs = (self._costs + [min(costs)])[-16:]
        cost = sorted(self._costs)[len(self._costs) // 2] if self._costs else 0.0
        votes = None if barrier else [a[5] for a in arrivals if a[5]] or None  # rollback.py's, when any voted
        self._result = (commands, step + spacing_steps(slowest, cost), votes)
        self._arrived = {}
        self._round += 1
        self.exchanges += 1
        self._cond.notify_all()
        return True

    def wake(self) -> None:
        """A command was queued: a paused round holding open may go."""
        with self._cond:
            self._cond.notify_all()
