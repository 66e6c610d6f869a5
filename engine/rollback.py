"""``--on-anomaly rollback``: the policy. When a step is bad, where to go back, what the run is told.

The snapshots themselves (taken every K steps, promoted once known sound, put back in place)
are the keeper's (keeper.py). This module decides: on CPU each step's loss and gradient norm
are judged before its update (spikes.py), for nothing; on a GPU the flusher judges the rows it
moves to the host anyway, and a bad step found there rolls back at the next step boundary, to
the newest snapshot taken before it; under DDP no rank decides alone: every rank says what it
found at a command exchange (hub.py), and every rank promotes, and rolls back, at the same
exchange. A bad step (non-finite, or a spike) has the good snapshot restored in place and the
update under way dropped; the script's loop goes on with its next batches. Too many rollbacks
pause (or stop) the run; ``--rollback-lr`` lowers the LR for a while. See docs/rollback.md.
"""

from __future__ import annotations

import math
from typing import Callable

from .keeper import Keeper
from .shared import events
from .shared.names import GRAD_NORM, LOSS
from .shared.protocol import Command
from .spikes import WARMUP, Window


class Rollback:
    """The spike limits and the decision to roll back (module docstring); ``keeper`` holds
    the snapshots.

    ``discovery`` finds the script's objects; ``journal`` journals; ``settings`` holds the
    LR factor; ``submit(command)`` queues a pause or a stop; ``dist`` is the rank channel;
    ``unattended``: a pause would only time out.
    """

    def __init__(self, config, discovery, journal, settings, submit: Callable[[Command], None], dist,
                 unattended: bool, step_seconds: Callable[[], float] = lambda: 0.0) -> None:
        self._discovery, self._journal, self._settings, self._submit = discovery, journal, settings, submit
        self._dist, self._unattended = dist, unattended
        self.keeper = Keeper(config=config, discovery=discovery, journal=journal, dist=dist,
                             step_seconds=step_seconds, stopped=self._stopped)
        self._lr = config.rollback_lr
        self._limit = config.rollback_limit
        self.acting = config.on_anomaly == "rollback"
        """Whether anomalies roll back by themselves (else only the ``rollback`` command does)."""
        self.loss = Window()
        self.norm = Window()
        self._norm_before: float | None = None  # the newest good norm the training thread judged
        self.state = None
        """The step boundary's shared state (stepstate.py), told the loss's spike limit."""
        self.verified = 0
        """The step up to which the flusher found every step sound (GPU)."""
        self.wanted: tuple[int, str] | None = None
        """A rollback asked for by the flusher or by this rank's vote: (first bad step, why)."""
        self._wanted_due = False
        self._excluded: list[list[float]] = []
        """[first, last] step ranges whose rows are left out of the windows (rolled back)."""
        self._times: list[int] = []
        self._lr_until: int | None = None
        self._lr_base = 1.0
        self._early: list[float] = []
        self._dropped = -1
        """The step whose update the last rollback dropped."""

    @classmethod
    def for_run(cls, config, discovery, journal, settings, controls, anomalies, hooks, dist) -> Rollback | None:
        """The part a run's config asks for, wired to the parts that call it; None when it keeps no snapshot."""
        if config.on_anomaly != "rollback" and not config.rollback_every:
            return None
        part = cls(config, discovery, journal, settings, controls.submit, dist, config.pause_timeout is not None,
                   step_seconds=lambda: hooks.state.last_step_s)
        part.state = hooks.state
        controls.rollback = anomalies.rollback = hooks.pre.rollback = part
        return part

    @property
    def off(self) -> str | None:
        """Why no snapshot is kept (too big, shards, ranks without ptdash), or None."""
        return self.keeper.off

    @property
    def at_step(self) -> bool:
        """Whether every step is judged before its update (the state is on CPU)."""
        return self.keeper.at_step

    @property
    def judging(self) -> bool:
        """Whether the training thread judges spikes (rolling back by itself, on CPU)."""
        return self.acting and self.keeper.at_step and self.keeper.off is None

    @property
    def local(self) -> bool:
        """Whether this process decides alone (no rank channel)."""
        return self.keeper.local

    @property
    def due(self) -> bool:
        """Something for the next step boundary: a rollback, or a CUDA copy to fence."""
        return self._wanted_due or self.keeper.fence_due

    # ------------------------------------------------------------- training thread

    def step_end(self, step: int) -> bool:
        """After each main step: refresh when due, promote a verified snapshot, end a lowered
        LR. Returns whether the controls have something for the next boundary."""
        if self._lr_until is not None and step >= self._lr_until:
            self._end_lr(step)
        if self.judging and self.loss.limit == math.inf:
            self._warm_up(step)
        self.keeper.step_end(step, self.verified)
        return self.due

    def _warm_up(self, step: int) -> None:
        """Until the flusher has a limit for the loss, the training thread takes one from the
        losses it sees at the steps' ends (CPU floats): fast steps are judged from the
        WARMUP-th step on, not from the first flush, which may come hundreds of steps later."""
        if self.state is None or self._left_out(step):
            return
        for loss in self.state.ended_losses:
            value = loss if type(loss) is float else loss.item() if loss.is_cpu else None
            if value is not None and math.isfinite(value):
                self._early.append(value)
        if len(self._early) >= WARMUP and step % 8 == 0:
            self.loss.early(self._early[-WARMUP * 4:])
            self.state.loss_max = self.loss.limit

    def _stopped(self, why: str) -> None:
        """The keeper keeps no snapshot from now on: an anomaly pauses instead."""
        if self.state is not None:
            self.state.loss_max = math.inf
        self._journal.event(events.Warned(text=why), f"rollback off: {why}; an anomaly pauses the run instead")

    def judge(self, losses: list, norm: float | None) -> str | None:
        """Why the step whose CPU ``losses`` and gradient ``norm`` (read already, or None) are
        given is a spike, or None (training thread, before its update; reads CPU values only)."""
        if not self.at_step:
            return None
        for loss in losses:
            value = loss if type(loss) is float else loss.item() if loss.is_cpu else None
            if value is not None and value > self.loss.limit:
                return f"loss spike: {value:.4g} over the limit {self.loss.limit:.4g} of its recent values"
        if norm is not None and self.norm.over(norm, self._norm_before):
            return f"gradient norm spike: {norm:.4g} over the limit {self.norm.limit:.4g} of its recent values"
        if norm is not None:
            self._norm_before = norm
        return None

    def before_update(self, step: int, why: str) -> None:
        """A bad step found before its update (CPU): roll back now, or (DDP) vote for it and
        let the exchange decide. The update under way is dropped when alone."""
        if step == self._dropped:
            return  # a step whose update a rollback at its boundary dropped: its values are the ruined state's
        self._exclude(step)
        if not self.local:
            if self.wanted is None:
                self.wanted = (step, why)
            return
        self.restore(step, step, why)

    def at_boundary(self, step: int) -> None:
        """The step boundary before step ``step + 1``'s update: fence a CUDA copy, and roll
        back when the flusher asked (alone)."""
        self._wanted_due = False
        self.keeper.fence()
        if self.wanted is not None and self.local:
            first, why = self.wanted
            self.restore(step + 1, first, why)

    def command(self, step: int) -> tuple[bool, str]:
        """The ``rollback`` command (dashboard, ``ptdash ctl``): roll back now."""
        if self.keeper.good is None:
            return False, self._nothing()
        self.restore(step + 1, step + 1, "a rollback asked for")
        return True, f"rolled back to step {self.keeper.good.step}"

    def _nothing(self) -> str:
        if self.off:
            return f"nothing to roll back to: {self.off}"
        if not self._discovery.live(self._discovery.optimizers):  # steps ptdash infers (manual.py)
            return "nothing to roll back to: the script updates its parameters itself (no torch.optim optimizer)"
        return ("nothing to roll back to yet: no snapshot before the bad step was known sound" if self.keeper.noted
                else f"nothing to roll back to yet: the first snapshot is taken at step {self.keeper.every}")

    def restore(self, step: int, first: int, why: str) -> None:
        """Put the good state back and drop the gradients of the update of ``step``."""
        keeper = self.keeper
        self.wanted, self._dropped = None, step
        if self.local:  # the flush that found the bad step judged every step up to it
            keeper.promote_through(min(self.verified, first - 1))
        keeper.drop_pending()
        self._close_exclusion(first, step)
        try:
            good = keeper.put_back()
        except ValueError as exc:
            keeper.stop(str(exc))
            return
        if good is None:
            self._journal.event(events.Rollback(step=step, from_step=first, why=why, skipped=1),
                                f"{why} at step {first}; {self._nothing()}: the update of step {step} is skipped")
            return
        skipped = step - good.step
        self._times = [s for s in self._times if s > step - self._limit[1]] + [step]
        lowered = self._lower_lr(step)
        self._journal.event(events.Rollback(step=step, from_step=first, to_step=good.step, why=why, skipped=skipped,
                                            lr_scale=self._settings.lr_scale if lowered else None),
                            f"{why} at step {first}: rolled back to step {good.step}, {skipped} batch"
                            f"{'es' if skipped != 1 else ''} skipped" + (f"; LR factor {self._settings.lr_scale:g} "
                                                                         f"until step {self._lr_until}" if lowered else ""))
        if len(self._times) > self._limit[0]:
            self._times = []
            n, m = self._limit
            what = "stop" if self._unattended else "pause"
            self._journal.event(events.Rollback(step=step, limit=n, within=m, action=what),
                                f"more than {n} rollbacks within {m} steps: {what}ping instead of rolling back again")
            self._submit(Command(id=f"rollback-limit-{step}", name=what))

    def _lower_lr(self, step: int) -> bool:
        if self._lr is None:
            return False
        factor, steps = self._lr
        s = self._settings
        if self._lr_until is None:
            self._lr_base = s.lr_scale
        s.lr_scale = max(1e-6, self._lr_base * factor)
        self._lr_until = step + steps
        self._journal.set_state(None)
        return True

    def _end_lr(self, step: int) -> None:
        s, until, self._lr_until = self._settings, self._lr_until, None
        factor = self._lr[0]
        if s.lr_scale == max(1e-6, self._lr_base * factor):  # not changed by a command meanwhile
            s.lr_scale = self._lr_base
            self._journal.set_state(None)
            self._journal.event(events.Rollback(step=step, lr_scale=s.lr_scale),
                                f"LR factor back to {s.lr_scale:g} at step {step}, {until - step + self._lr[1]} "
                                "steps after the rollback")

    # ------------------------------------------------------------ DDP (training thread)

    def vote(self, step: int) -> list:
        """What this rank says at the exchange of step ``step``: ``[why or None, verified step,
        first bad step or None]`` (on CPU every step so far was judged before its update)."""
        why, first = (None, None) if self.wanted is None else (f"rank {self._dist.rank}: {self.wanted[1]}",
                                                                 self.wanted[0])
        return [why, step if self.at_step else self.verified, first]

    def agreed(self, verdict: list, step: int) -> None:
        """The exchange's verdict, the same on every rank: roll back, or promote."""
        why, through, first = verdict
        bad = first if first is not None else step + 1
        sound = through if not why or through is None else min(through, bad - 1)  # the newest step judged good
        self.keeper.promote_through(sound)  # every rank judged it sound; a rollback the same verdict asks goes to it
        if why:
            self.restore(step + 1, bad, why)

    # ------------------------------------------------------------ flusher thread

    def observe(self, rows: list) -> None:
        """A flush's rows: judge the steps not judged before their update (GPU), keep the
        good values in the windows, and update the limits."""
        for step, _wall, values in rows:
            if self._left_out(step):
                continue
            loss, norm = values.get(LOSS), values.get(GRAD_NORM)
            nonfinite = (LOSS in values and loss is None) or (GRAD_NORM in values and norm is None)
            if self.acting and not self.at_step and self.wanted is None:
                why = "non-finite loss or gradient" if nonfinite else \
                    f"loss spike: {loss:.4g} over the limit {self.loss.limit:.4g}" if loss is not None and \
                    self.loss.over(loss) else f"gradient norm spike: {norm:.4g} over the limit {self.norm.limit:.4g}" \
                    if norm is not None and self.norm.over(norm, self.norm.newest) else None
                if why is not None:
                    self._exclude(step)
                    self.wanted, self._wanted_due = (step, why), True
                    continue
            if nonfinite:
                continue
            if loss is not None:
                self.loss.add(loss)
            if norm is not None:
                self.norm.add(norm)
            self.verified = step
        limit = self.loss.update() if self.judging else math.inf
        self.norm.update()
        if self.state is not None and self.off is None:
            self.state.loss_max = limit

    def _exclude(self, first: int) -> None:
        """Leave out the rows from ``first`` on, until the rollback closes the range."""
        if not self._excluded or self._excluded[-1][1] != math.inf:
            self._excluded.append([first, math.inf])

    def _close_exclusion(self, first: int, last: int) -> None:
        if self._excluded and self._excluded[-1][1] == math.inf:
            self._excluded[-1] = [min(first, self._excluded[-1][0]), last]
        else:
            self._excluded.append([first, last])
        self._excluded = self._excluded[-16:]

    def _left_out(self, step: int) -> bool:
        return any(lo <= step <= hi for lo, hi in self._excluded)
