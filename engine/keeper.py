"""The rollback's mechanics: the snapshots kept in host memory, refreshed, promoted, put back.

Every K steps a step's end copies the training state into a host snapshot (snapshot.py). On
CPU, alone, each step is judged before its update, so the copy is *good* when taken: one
copy is kept. Otherwise (a GPU, whose steps are judged a flush later; ranks, which agree at
an exchange) it is *pending* until every step up to it is known sound, and the good one
before it stays meanwhile: two copies. What decides that a step is bad, where to go back
and what the run is told is the policy's (rollback.py); this module only keeps and restores.
"""

from __future__ import annotations

import math
import time
from typing import Callable

import torch

from .shared import events
from .shared.diskspace import fmt_bytes
from .snapshot import Snapshot, default_memory, sharded_models, side_sources

MIN_EVERY = 10
"""Steps between refreshes at least, when ``--rollback-every`` is not given."""
DDP_EVERY = 100
"""Steps between refreshes under DDP without ``--rollback-every``: every rank must refresh
at the same steps, so the period cannot follow each rank's own timing."""
BUDGET_SHARE = 0.5
"""The share of the overhead budget the refreshes may take (the rest is the statistics')."""


class Keeper:
    """The good snapshot, the pending one, and their refreshes (module docstring).

    ``discovery`` finds the script's objects; ``journal`` says once what a snapshot costs;
    ``dist`` is the rank channel; ``step_seconds()`` the recent step time (for the period);
    ``stopped(why)`` is told when snapshots can no longer be kept (the policy says it).
    """

    def __init__(self, *, config, discovery, journal, dist, step_seconds: Callable[[], float],
                 stopped: Callable[[str], None]) -> None:
        self._discovery, self._journal, self._dist = discovery, journal, dist
        self._step_seconds, self._stopped = step_seconds, stopped
        self._fixed_every = config.rollback_every
        self.every = config.rollback_every or MIN_EVERY
        self._budget = config.overhead_budget / 100.0
        self.memory = config.rollback_memory or default_memory()
        self.good: Snapshot | None = None
        self.pending: Snapshot | None = None
        self._spare: Snapshot | None = None
        self._stream = None
        self._fence: Snapshot | None = None
        self.off: str | None = None
        """Why no snapshot is kept (too big, shards, ranks without ptdash), or None."""
        self.noted = False
        """Whether a snapshot was taken (its cost said once)."""
        self.refresh_s = 0.0
        self.at_step = False
        """Whether the state is on CPU, so every step is judged before its update."""
        self._next = self.every
        self._aligned = bool(config.rollback_every) or dist.multi
        """Refreshes at multiples of ``every`` (every rank at the same steps), else ``every``
        steps after the last one (the period follows the measured cost)."""

    @property
    def local(self) -> bool:
        """Whether this process decides alone (no rank channel)."""
        return not self._dist.ready

    @property
    def fence_due(self) -> bool:
        """Whether a CUDA copy must be fenced at the next step boundary."""
        return self._fence is not None

    # ------------------------------------------------------------- training thread

    def step_end(self, step: int, verified: int) -> None:
        """After each main step: promote a pending snapshot every step up to which was found
        sound (``verified``, alone), and refresh when due."""
        if self.pending is not None and self.local and self.pending.step <= verified and self.pending.ready():
            self.promote()
        if self.off is None and step > 0 and (step % self.every == 0 if self._aligned else step >= self._next):
            self.refresh(step)
            self._next = step + self.every

    def refresh(self, step: int) -> None:
        """Copy the state of step ``step`` (at its end) into a snapshot, unless the one before
        is not known sound yet (it stays), or the state cannot be kept (then ``stopped``)."""
        if self.pending is not None:
            return  # the one before is not known sound yet (a flush, or an exchange, later): it stays
        d = self._discovery
        models = d.ensure_models()
        optimizers = d.live(d.optimizers)
        if not models or not optimizers:
            return
        if sharded_models(models):  # the same models on every rank: all stop keeping at once
            self.stop("the model's parameters are shards (FSDP), which a snapshot cannot copy yet")
            return
        if self._dist.multi and not self._dist.ready:
            self.stop("some ranks run without ptdash, so they could not roll back with the others")
            return
        t0 = time.perf_counter()
        structure, sources = Snapshot.gather(models, optimizers, d.top_schedulers(), d.live(d.scalers))
        cuda = any(t.device.type == "cuda" for t in sources)
        self.at_step = not cuda
        immediate = self.at_step and self.local
        needed = Snapshot.needed(sources) * (1 if immediate else 2)
        if needed > self.memory:
            self.stop(f"the state takes {fmt_bytes(needed)} of host memory"
                      f"{'' if immediate else ' (two copies)'}, over --rollback-memory {fmt_bytes(self.memory)}")
            return
        if cuda and self._stream is None:
            self._stream = torch.cuda.Stream()
        if immediate:
            target = self.good = self.good or Snapshot()
        else:
            target = self.pending or self._spare or Snapshot()
            self.pending, self._spare = target, None
        target.take(step, structure, sources, self._stream if cuda else None,
                    side=side_sources(models, structure, sources))
        if cuda:
            if len(optimizers) > 1:
                target.fence()  # another optimizer updates after this step's end: wait now
            else:
                self._fence = target  # before the next update (its boundary)
        seconds = time.perf_counter() - t0
        self.refresh_s = seconds if not self.refresh_s else 0.8 * self.refresh_s + 0.2 * seconds
        self._period()
        if not self.noted:
            self.noted = True
            self._journal.event(events.Snapshot(step=step, bytes=needed, seconds=seconds, every=self.every,
                                                limit=self.memory),
                                f"rollback: the state of step {step} is kept in host memory: {fmt_bytes(needed)}"
                                f"{'' if immediate else ' (two copies)'}, {seconds * 1e3:.1f} ms a refresh, "
                                f"every {self.every} steps (--rollback-memory {fmt_bytes(self.memory)})")

    def _period(self) -> None:
        """Steps between refreshes: --rollback-every, DDP_EVERY, or what the budget affords."""
        if self._fixed_every:
            return
        if self._dist.multi:
            self.every = DDP_EVERY
            return
        step_s = self._step_seconds()
        if step_s > 0 and self._budget > 0:
            self.every = max(MIN_EVERY, math.ceil(self.refresh_s / (BUDGET_SHARE * self._budget * step_s)))

    def fence(self) -> None:
        """At a step boundary: the training stream waits for a pending CUDA copy (on the
        device) before the next update writes what it reads."""
        if self._fence is not None:
            self._fence.fence()
            self._fence = None

    def promote(self, wait: bool = False) -> None:
        """The pending snapshot becomes the good one (the good one before it the spare)."""
        if wait and self.pending.done is not None:
            self.pending.done.synchronize()  # issued a flush or an exchange ago: long landed, as a rule
        self.good, self._spare, self.pending = self.pending, self.good, None

    def promote_through(self, sound: int | None) -> None:
        """Promote the pending snapshot when it was taken at or before ``sound``, the newest
        step known sound (waiting for its copies: they were issued a flush ago)."""
        if self.pending is not None and sound is not None and self.pending.step <= sound:
            self.promote(wait=True)

    def drop_pending(self) -> None:
        """A pending snapshot not known sound (taken after a bad step, perhaps): never promoted."""
        if self.pending is not None:
            self._spare, self.pending = self.pending, None

    def put_back(self) -> Snapshot | None:
        """Write the good snapshot into the script's objects and drop the gradients of the
        update under way; the snapshot put back, or None (then only the gradients are
        dropped). Raises ValueError when the objects no longer match it (they are unchanged)."""
        d = self._discovery
        optimizers = d.live(d.optimizers)
        good = self.good
        try:
            if good is not None:
                good.restore(d.ensure_models(), optimizers, d.top_schedulers(), d.live(d.scalers))
        finally:
            drop_grads(optimizers)
        return good

    def stop(self, why: str) -> None:
        """Keep no snapshot from now on, and say why (``stopped``)."""
        self.off = why
        self.good = self.pending = self._spare = None
        self._stopped(why)


def drop_grads(optimizers) -> None:
    """Drop the gradients of ``optimizers``' parameters: their next update skips them."""
    for opt in optimizers:
        for group in opt.param_groups:
            for p in group["params"]:
                p.grad = None  # the optimizer skips parameters without gradients
