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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from .doctor.rules import RULES
from .shared import events, flight, packed, stacks
from .shared.protocol import ENDED, Event, LayerNames, Layers, Message, Metrics, Samples, Schedule
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
        self._walls: dict[int, float] = {}
        """Rank -> the wall time its newest step ended at (the row's own)."""
        self._stall: OpenStall | None = None
        """The stall going on."""
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
            self._advanced(0, own_rows, now)
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
            self._advanced(rank, rows, now)
        if samples:
            self._publish(Samples(rows=samples, rank=rank))

    def _advanced(self, rank: int, rows: list, now: float) -> None:
        """A flush of ``rank`` (its ``[step, wall, values]`` rows): progress only if its last is a
        step not seen yet (a row of a step seen already holds what the script printed since, not
        a step made). The first step after a stall's is when the stall ended."""
        step, wall = rows[-1][0], rows[-1][1]
        stall = self._stall
        if stall is not None and step <= stall.step:  # steps made before the stall, reported late
            return
        if self._progress.get(rank, (None, 0.0))[0] != step:
            self._progress[rank] = (step, now)
            self._walls[rank] = wall
            if stall is not None and stall.resumed is None:
                stall.resumed = next((r[1] for r in rows if r[0] > stall.step), wall)

    def _watch(self, now: float) -> None:
        """A stall is named once: the ranks behind the others, or a stopped process; a rank
        that only waits for a stalled one (its peers block in a collective) is not named. It is
        over when some rank makes a step again, or when the run ends."""
        state = self._state()
        if state in ENDED and self._stall is not None:
            self._over(with_run=True)
        if state != "running" or not self._progress:
            return
        quiet = {rank: step for rank, (step, since) in self._progress.items() if now - since > self._stall_seconds}
        if len(quiet) < len(self._progress):
            if self._stall is not None:
                self._over(with_run=False)
            return
        if self._stall is not None:
            return
        since = max(t for _, t in self._progress.values())
        stopped = [rank for rank, pid in sorted(self._pids().items()) if _process_state(pid) == "T"]
        lowest, highest = min(quiet.values()), max(quiet.values())
        behind = [rank for rank, step in sorted(quiet.items()) if step == lowest]
        if stopped:
            culprits, why = stopped, "its process is stopped (SIGSTOP or a debugger)"
        elif len(behind) < len(quiet):
            culprits, why = behind, f"the others wait for it at step {highest}"
        else:
            culprits, why = [], ""
        seconds = now - since
        started = max(self._walls.values(), default=time.time() - seconds)
        # The run stands at the newest step: a rank reported behind it may have made the steps
        # unreported (its flusher starved by C code holding its GIL), as DDP's lockstep says.
        self._stall = stall = OpenStall(step=highest, started=started,
                                        steps={rank: step for rank, (step, _) in self._progress.items()})
        if self.stacks is None:
            self._name_stall(stall, culprits, why, seconds, [])
        else:  # the ranks answer within seconds; the flusher does not wait for them
            threading.Thread(target=self._stall_with_stacks, args=(stall, culprits, why, seconds),
                             name="ptdash-stall-stacks", daemon=True).start()

    def _stall_with_stacks(self, stall: OpenStall, culprits: list[int], why: str, seconds: float) -> None:
        try:
            taken = self.stacks()
        except Exception:  # noqa: BLE001 - the stall is named without them
            log.exception("could not take the ranks' stacks at a stall")
            taken = []
        self._name_stall(stall, culprits, why, seconds, taken)

    def _name_stall(self, stall: OpenStall, culprits: list[int], why: str, seconds: float, taken: list[dict]) -> None:
        step = stall.step
        ranks = stacks.read(taken)
        where = stacks.summary(ranks, seconds, so_far=True) if len(ranks) else ""
        if not culprits and ranks:
            culprits = stacks.culprits(ranks)
            if culprits:
                why = "the others wait for it (by the stacks)"
            elif culprits := flight.behind(ranks):
                why = "the others made a collective it has not (by the flight recorder)"
        if culprits:
            who = f"rank{'s' if len(culprits) > 1 else ''} {', '.join(map(str, culprits))}"
            last = min(stall.steps.get(r, step) for r in culprits)
            heard = f"for {seconds:.0f} s (at step {step})" if last >= step else \
                f"reported for {seconds:.0f} s (the last at step {last})"
            text = f"{who} stalled: no step {heard}; {why}"
        else:
            text = f"no rank made a step for {seconds:.0f} s (all at step {step})"
        if where:
            text += f": {where}"
        with self._lock:
            current = self._stall is stall  # not already over while the stacks were taken
            if current:
                self.stalled = text
            self._event(events.Stall(step=step, ranks=tuple(culprits), seconds=seconds, started=stall.started,
                                     why=why, where=where, stacks=tuple(ranks)), text)
            if where:
                self._finding(step, where, seconds, over=False)
            stall.ranks, stall.named = ranks, True
            ended = stall.ended
        if current:
            self._on_stall(text)
        if ended is not None:  # it was over before its stacks came: its end follows its start
            self._journal_end(stall, *ended)

    def _finding(self, step: int, where: str, seconds: float, over: bool, with_run: bool = False) -> None:
        """The stall's doctor finding (a case a stall: each one its own); raised again when the
        stall is over, with its whole length (readers keep the newest words of a finding)."""
        rule = RULES["stalled"]
        self._event(events.Finding(id="stalled", what=where, why=rule.why, fix=rule.fix, severity=rule.severity,
                                   step=step, case=f"step {step}",
                                   extra={"seconds": round(seconds, 3), "over": over, "with_run": with_run}),
                    f"stalled: {where}")

    def _over(self, with_run: bool) -> None:
        """The stall is over: its whole length, from its last step before to the first step after
        (the rows' own times), or to now when the run ended during it."""
        stall, self._stall, self.stalled = self._stall, None, None
        self._on_stall(None)
        if stall.resumed is not None:  # a rank stepped in the flush that saw the run end too
            with_run = False
        end = stall.resumed if stall.resumed is not None else time.time()
        with self._lock:
            stall.ended = (max(0.0, end - stall.started), with_run)
            if not stall.named:
                return  # its start is not journaled yet: _name_stall journals the end after it
        self._journal_end(stall, *stall.ended)

    def _journal_end(self, stall: OpenStall, seconds: float, with_run: bool) -> None:
        how = "the run ended while stalled" if with_run else "every rank makes steps again"
        where = stacks.summary(stall.ranks, seconds) if stall.ranks else ""
        self._event(events.Stall(step=stall.step, seconds=seconds, started=stall.started, ended=True,
                                 with_run=with_run, where=where),
                    f"the stall at step {stall.step} is over after {seconds:.0f} s: {how}")
        if where:
            self._finding(stall.step, f"{where}{'; the run ended while stalled' if with_run else ''}", seconds,
                          over=True, with_run=with_run)


@dataclass
class OpenStall:
    """The stall going on, as the hub keeps it until it is over and journaled."""

    step: int
    started: float
    """The wall time of the newest step before it."""
    steps: dict[int, int]
    """Each rank's newest reported step when it was named; ``step``, the newest of them, is
    where the run stands: a step past it ends the stall."""
    resumed: float | None = None
    """The wall time of the first step after it."""
    ranks: list = field(default_factory=list)
    """Every rank's stacks, taken when it was named."""
    named: bool = False
    ended: tuple[float, bool] | None = None
    """(its length, whether the run's end ended it), once over."""


def _process_state(pid: int) -> str | None:
    """The state letter of a process (R, S, D, T, Z...) from /proc, or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[0] if ")" in stat else None
