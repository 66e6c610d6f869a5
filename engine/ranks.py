"""Rank 0's view of the other ranks: their rows and events into the store and to the
dashboards, and the ranks that stopped making steps.

The other ranks' flushers hand their rows to rank 0 through the rank channel
(``distributed.Distributed.push``); rank 0's flusher pulls them here.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable

from .shared.protocol import Event, Message, Metrics, Samples, from_dict


class RankCollector:
    """Stores and publishes what the other ranks pushed; names a rank that stalls.

    ``publish(msg)`` sends to the dashboards; ``event`` journals; ``state()`` is the run
    state (a paused or stopping run has no stalls).
    """

    def __init__(self, dist, store, publish: Callable[[Message], None], event: Callable[..., object],
                 state: Callable[[], str], stall_seconds: float) -> None:
        self._dist, self._store, self._publish, self._event = dist, store, publish, event
        self._state, self._stall_seconds = state, stall_seconds
        self._progress: dict[int, tuple[int, float]] = {}
        """Rank -> (its newest step, when it arrived)."""
        self._stalled: set[int] = set()

    def collect(self, own_rows: list) -> None:
        now = time.monotonic()
        if own_rows:
            self._progress[0] = (own_rows[-1][0], now)
        for rank, payload in self._dist.pull():
            events = [replace(e, rank=rank) for e in map(from_dict, payload["events"]) if isinstance(e, Event)]
            samples = payload.get("samples") or []
            self._store.write(rows=payload["rows"], rank=rank, events=events, samples=samples)
            for event in events:
                self._publish(event)
            if payload["rows"]:
                self._publish(Metrics(rows=payload["rows"], rank=rank))
            if samples:
                self._publish(Samples(rows=samples, rank=rank))
            if payload["rows"]:
                self._progress[rank] = (payload["rows"][-1][0], now)
                self._stalled.discard(rank)
        if self._state() != "running":
            return
        for rank, (step, since) in self._progress.items():
            if now - since > self._stall_seconds and rank not in self._stalled:
                self._stalled.add(rank)
                self._event("anomaly", f"rank {rank} stalled: no step for {now - since:.0f} s (at step {step})",
                            stalled_rank=rank, step=step)
