"""The hub's view of the ranks in other processes: their rows and events into the store and
to the dashboards, and the ranks that stopped making steps.

A rank's flusher hands each flush to the hub over the rank link (link.py); the hub's link
threads queue it here (``receive``) and the hub's flusher writes it (``collect``), so
the store is only ever written from the flusher thread.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

from .doctor.rules import RULES
from .shared import events, packed, stacks
from .shared.protocol import Event, LayerNames, Layers, Message, Metrics, Samples, Schedule
from .shared.wire import from_dict

log = logging.getLogger("ptdash.ranks")

QUEUED_FLUSHES = 4096
"""Flushes of other ranks kept for the store while the flusher is behind; the oldest go first."""

FLUSH_COST_S = 0.001
"""The hub's CPU for one flush of another rank, whatever its rows: mostly the store's two
transactions (0.6-0.9 ms measured, benchmarks/hub_scale.py and README there)."""

HUB_SHARE = 0.25
"""The share of a core the other ranks' flushes may cost the hub."""


def push_interval(world: int) -> float:
    """Seconds between the flushes of each rank other than the hub's, at least: 4 ms a rank
    (nothing below 63 ranks, whose 0.25 s is more; 4 s at 1,000), so that the hub's store
    work stays under HUB_SHARE of a core however many ranks there are."""
    return max(0, world - 1) * FLUSH_COST_S / HUB_SHARE


class RankCollector:
    """Stores and publishes what the other ranks sent; names a rank that stalls.

    ``publish(msg)`` sends to the dashboards; ``event`` journals; ``state()`` is the run
    state (a paused or stopping run has no stalls). ``pids()`` maps ranks to their pids
    (as the kernel named them), to tell a stopped process from one that waits for it.
    """

    def __init__(self, store, publish: Callable[[Message], None], event: Callable[..., object],
                 state: Callable[[], str], stall_seconds: float,
                 pids: Callable[[], dict[int, int]] = dict,
                 on_stall: Callable[[str | None], None] = lambda text: None) -> None:
        self._store, self._publish, self._event, self._on_stall = store, publish, event, on_stall
        self._state, self._stall_seconds, self._pids = state, stall_seconds, pids
        self._queue: collections.deque[tuple[int, dict]] = collections.deque(maxlen=QUEUED_FLUSHES)
        self._lock = threading.Lock()
        self._progress: dict[int, tuple[int, float]] = {}
        """Rank -> (its newest step, when it arrived)."""
        self._stalled = False
        self.stalled: str | None = None
        """What the newest stall is (for run.json), or None while every rank makes steps."""
        self.stacks: Callable[[], list[dict]] | None = None
        """Every rank's stacks (stackgather.py), taken when a stall is named and kept with it."""

    def steps(self) -> dict[int, int]:
        """Each rank's newest step, as the hub last heard it."""
        return {rank: step for rank, (step, _) in list(self._progress.items())}

    def receive(self, rank: int, payload: dict) -> None:
        """A flush of ``rank`` (any thread): kept until the flusher's next ``collect``."""
        self._queue.append((rank, payload))

    def collect(self, own_rows: list) -> None:
        """Write and publish what the ranks sent; look for stalls (flusher thread)."""
        now = time.monotonic()
        if own_rows:
            self._advanced(0, own_rows[-1][0], now)
        while self._queue:
            rank, payload = self._queue.popleft()
            try:
                self._take(rank, payload, now)
            except Exception:  # noqa: BLE001 - one bad flush must not stop the others
                log.exception("a flush of rank %d could not be taken", rank)
        self._watch(now)

    def _take(self, rank: int, payload: dict, now: float) -> None:
        # ProtocolError for a damaged packing: this flush is dropped (collect logs it).
        rows = [r for r in packed.take(payload) if isinstance(r, list) and len(r) == 3]
        samples = payload.get("samples") or []
        events = [replace(e, rank=rank) for e in map(from_dict, payload.get("events") or []) if isinstance(e, Event)]
        layers = [m for m in map(from_dict, payload.get("layers") or [])
                  if isinstance(m, (Layers, LayerNames, Schedule))] if rank == 0 else []
        self._store.write(rows=rows, rank=rank, events=events, samples=samples, layers=layers)
        for event in events:
            self._publish(event)
        if rows:
            self._publish(Metrics(rows=rows, rank=rank))
            self._advanced(rank, rows[-1][0], now)
        if samples:
            self._publish(Samples(rows=samples, rank=rank))

    def _advanced(self, rank: int, step: int, now: float) -> None:
        """A flush of ``rank`` ends at ``step``: progress only if it is a step not seen yet (a
        row of a step seen already holds what the script printed since, not a step made)."""
        if self._progress.get(rank, (None, 0.0))[0] != step:
            self._progress[rank] = (step, now)

    def _watch(self, now: float) -> None:
        """A stall is named once: the ranks behind the others, or a stopped process; a rank
        that only waits for a stalled one (its peers block in a collective) is not named."""
        if self._state() != "running" or not self._progress:
            return
        quiet = {rank: step for rank, (step, since) in self._progress.items() if now - since > self._stall_seconds}
        if len(quiet) < len(self._progress):
            if self._stalled:
                self._stalled, self.stalled = False, None
                self._event(events.Stall(step=min(step for step, _ in self._progress.values()), ended=True),
                            "every rank makes steps again")
                self._on_stall(None)
            return
        if self._stalled:
            return
        since = max(t for _, t in self._progress.values())
        stopped = [rank for rank, pid in sorted(self._pids().items()) if _process_state(pid) == "T"]
        lowest = min(quiet.values())
        behind = [rank for rank, step in sorted(quiet.items()) if step == lowest]
        if stopped:
            culprits, why = stopped, "its process is stopped (SIGSTOP or a debugger)"
        elif len(behind) < len(quiet):
            culprits, why = behind, f"the others wait for it at step {max(quiet.values())}"
        else:
            culprits, why = [], ""
        seconds = now - since
        self._stalled = True
        if self.stacks is None:
            self._name_stall(lowest, culprits, why, seconds, [])
        else:  # the ranks answer within seconds; the flusher does not wait for them
            threading.Thread(target=self._stall_with_stacks, args=(lowest, culprits, why, seconds),
                             name="ptdash-stall-stacks", daemon=True).start()

    def _stall_with_stacks(self, lowest: int, culprits: list[int], why: str, seconds: float) -> None:
        try:
            taken = self.stacks()
        except Exception:  # noqa: BLE001 - the stall is named without them
            log.exception("could not take the ranks' stacks at a stall")
            taken = []
        self._name_stall(lowest, culprits, why, seconds, taken)

    def _name_stall(self, lowest: int, culprits: list[int], why: str, seconds: float, taken: list[dict]) -> None:
        ranks = stacks.read(taken)
        where = stacks.summary(ranks, seconds) if len(ranks) else ""
        if not culprits and ranks:
            culprits = stacks.culprits(ranks)
            if culprits:
                why = "the others wait for it (by the stacks)"
        if culprits:
            who = f"rank{'s' if len(culprits) > 1 else ''} {', '.join(map(str, culprits))}"
            text = f"{who} stalled: no step for {seconds:.0f} s (at step {lowest}); {why}"
        else:
            text = f"no rank made a step for {seconds:.0f} s (all at step {lowest})"
        if where:
            text += f": {where}"
        if self._stalled:  # not already over while the stacks were taken
            self.stalled = text
        self._event(events.Stall(step=lowest, ranks=tuple(culprits), seconds=seconds, why=why, where=where,
                                 stacks=tuple(ranks)), text)
        if where:
            self._event(events.Finding(id="stalled", what=where, why=RULES["stalled"].why, fix=RULES["stalled"].fix,
                                       severity=RULES["stalled"].severity, step=lowest, case=f"step {lowest}"),
                        f"stalled: {where}")  # a case a stall: each one its own finding
        self._on_stall(text)


def _process_state(pid: int) -> str | None:
    """The state letter of a process (R, S, D, T, Z...) from /proc, or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[0] if ")" in stat else None
