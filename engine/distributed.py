"""Multi-rank runs: commands reach every rank at the same step, metrics reach rank 0.

Rank 0 owns the command inbox. At agreed step boundaries every rank joins a tiny
broadcast (a fixed-size float64 packet on a private gloo group, so it never touches the
GPU or the user's NCCL communicator) and applies the same commands at the same step. The
packet also says when the next exchange happens: rank 0 spaces them by their measured
cost so that they take under 0.5% of the time (and at most one every
``EXCHANGE_SECONDS``, which bounds a command's latency in steps), and every rank reads
the same schedule, so no rank ever waits for a collective the others skip.

Metrics from other ranks travel through the job's existing c10d store (rank 0's TCP
store, which every rank already reaches), written by each rank's flusher thread and read
by rank 0's. No new listener is opened anywhere.
"""

from __future__ import annotations

import json
import math
import os
import time

import torch
import torch.distributed as dist

from .shared.protocol import COMMANDS, Command

EXCHANGE_SECONDS = 0.05
"""At most one command exchange per this many seconds of training..."""

EXCHANGE_SHARE = 0.005
"""...and no more often than keeps their measured cost under this share of the time..."""

MAX_SPACING_SECONDS = 0.5
"""...but at least one per this many seconds, which bounds a command's wait."""

MAX_COMMANDS = 8
_PACKET = 2 + 2 * MAX_COMMANDS


def env_rank() -> tuple[int, int, int]:
    """``(rank, local_rank, world_size)`` as the launcher set them (0, 0, 1 when alone)."""
    return (int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0)),
            int(os.environ.get("WORLD_SIZE", 1)))


class Distributed:
    """This process's part in a multi-rank run; ``ready`` once the script set up torch.distributed."""

    def __init__(self) -> None:
        self.rank, self.local_rank, self.world_size = env_rank()
        self.group = None
        self.store = None
        self.next_exchange = 0
        self._seq = 0
        self._pulled: dict[int, int] = {}
        self.exchanges = 0
        self.exchange_seconds = 0.0
        """Time spent in command exchanges outside pauses, to report their cost per step."""

    @property
    def multi(self) -> bool:
        return self.world_size > 1

    @property
    def ready(self) -> bool:
        return self.group is not None

    def setup(self) -> bool:
        """Create the private group and store (all ranks, at their first optimizer step).

        False when the script never initialised torch.distributed (then every rank runs
        alone, e.g. independent jobs launched side by side).
        """
        if not (self.multi and dist.is_available() and dist.is_initialized()):
            return False
        self.group = dist.new_group(backend="gloo")
        self.store = dist.PrefixStore("ptdash/", _own_store_client() or dist.distributed_c10d._get_default_store())
        self.store.set(f"pid/{self.rank}", f"{os.uname().nodename} {os.getpid()}")
        return True

    # ------------------------------------------------- commands (training thread)

    def due(self, step: int) -> bool:
        return self.ready and step >= self.next_exchange

    def exchange(self, commands: list[Command], step: int, step_seconds: float) -> list[Command]:
        """Broadcast rank 0's commands; every rank returns the same list.

        Also agrees on the step of the next exchange. Collective: every rank calls it at
        the same step (``due``) or from the pause loop.
        """
        packet = torch.zeros(_PACKET, dtype=torch.float64)
        if self.rank == 0:
            cost = self.exchange_seconds / self.exchanges if self.exchanges else 0.0
            # Capped, so a command never waits more than about half a second for a slot.
            spacing = min(MAX_SPACING_SECONDS, max(EXCHANGE_SECONDS, cost / EXCHANGE_SHARE))
            every = max(1, min(1000, math.ceil(spacing / max(step_seconds, 1e-6))))
            packet[0] = step + every
            packet[1] = min(len(commands), MAX_COMMANDS)
            for i, cmd in enumerate(commands[:MAX_COMMANDS]):
                packet[2 + 2 * i] = COMMANDS.index(cmd.name)
                packet[3 + 2 * i] = math.nan if cmd.value is None else cmd.value
        t0 = time.perf_counter()
        dist.broadcast(packet, src=0, group=self.group)
        self.exchange_seconds += time.perf_counter() - t0
        self.exchanges += 1
        values = packet.tolist()  # a CPU tensor: no device sync
        self.next_exchange = int(values[0])
        if self.rank == 0:
            return list(commands[:MAX_COMMANDS])
        out = []
        for i in range(int(values[1])):
            value = values[3 + 2 * i]
            out.append(Command(id="", name=COMMANDS[int(values[2 + 2 * i])], value=None if math.isnan(value) else value))
        return out

    def barrier(self) -> None:
        if self.ready:
            dist.barrier(group=self.group)

    # ---------------------------------------------------- metrics (flusher threads)

    def push(self, payload: dict) -> None:
        """Rank > 0: hand one flush's rows and events to rank 0."""
        if self.store is None:
            return
        self.store.set(f"m/{self.rank}/{self._seq}", json.dumps(payload, separators=(",", ":")))
        self._seq += 1

    def pull(self) -> list[tuple[int, dict]]:
        """Rank 0: everything the other ranks pushed since the last pull, in order."""
        if self.store is None:
            return []
        out = []
        for rank in range(1, self.world_size):
            seq = self._pulled.get(rank, 0)
            while self.store.check([f"m/{rank}/{seq}"]):
                key = f"m/{rank}/{seq}"
                out.append((rank, json.loads(self.store.get(key))))
                self.store.delete_key(key)
                seq += 1
            self._pulled[rank] = seq
        return out

    def local_pids(self) -> list[int]:
        """Pids of the ranks on this host (for an immediate kill)."""
        if self.store is None:
            return []
        me = os.uname().nodename
        pids = []
        for rank in range(self.world_size):
            try:
                host, pid = self.store.get(f"pid/{rank}").decode().split()
            except Exception:
                continue
            if host == me:
                pids.append(int(pid))
        return pids


def _own_store_client():
    # A client connection of our own to the job's store, so the flusher threads never
    # share a socket with the training thread's use of the default store.
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not (addr and port):
        return None
    try:
        return dist.TCPStore(addr, int(port), is_master=False, timeout=_timedelta(30), wait_for_workers=False)
    except Exception:
        return None


def _timedelta(seconds: float):
    import datetime

    return datetime.timedelta(seconds=seconds)

