"""``--on-anomaly rollback``: the policy. When a step is bad, where to go back, what the run is told.

The snapshots themselves (taken every K steps, promoted once known sound, put back in place)
are the keeper's (keeper.py). This module decides: on CPU each step's loss and gradient norm
are judged before its update by the one judge (judge.py), for nothing; on a GPU the judge
sees the rows the flusher moves to the host anyway, and a bad step found there rolls back at
the next step boundary, to the newest snapshot taken before it; under DDP no rank decides alone: every rank says what it
found at a command exchange (hub.py), and every rank promotes, and rolls back, at the same
exchange. A bad step (non-finite, or a spike) has the good snapshot restored in place and the
update under way dropped; the script's loop goes on with its next batches. Too many rollbacks
pause (or stop) the run; ``--rollback-lr`` lowers the LR for a while. See docs/rollback.md.
"""

from __future__ import annotations

from typing import Callable

from .judge import Finding, Judge
from .keeper import Keeper
from .shared import events
from .shared.protocol import Command


class Rollback:
    """The decision to roll back and what it says (module docstring); ``keeper`` holds the
    snapshots.

    ``discovery`` finds the script's objects; ``journal`` journals; ``settings`` holds the
    LR factor; ``submit(command)`` queues a pause or a stop; ``dist`` is the rank channel;
    ``judge`` the one judge (its rolled-back ranges are left out of its windows);
    ``unattended``: a pause would only time out; ``step_seconds()`` the recent step time;
    ``ended_losses()`` the losses of the step that ended last (warming the judge up).
    """

    def __init__(self, *, config, discovery, journal, settings, submit: Callable[[Command], None], dist,
                 judge: Judge, unattended: bool, step_seconds: Callable[[], float] = lambda: 0.0,
                 ended_losses: Callable[[], list] = lambda: []) -> None:
        self._discovery, self._journal, self._settings, self._submit = discovery, journal, settings, submit
        self._dist, self._unattended, self._judge, self._ended_losses = dist, unattended, judge, ended_losses
        self.keeper = Keeper(config=config, discovery=discovery, journal=journal, dist=dist,
                             step_seconds=step_seconds, stopped=self._stopped)
        self._lr = config.rollback_lr
        self._limit = config.rollback_limit
        self.acting = config.on_anomaly == "rollback"
        """Whether anomalies roll back by themselves (else only the ``rollback`` command does)."""
        self.verified = 0
        """The step up to which the flusher found every step sound (GPU)."""
        self.wanted: tuple[int, str] | None = None
        """A rollback asked for by the flusher or by this rank's vote: (first bad step, why)."""
        self._wanted_due = False
        self._times: list[int] = []
        self._lr_until: int | None = None
        self._lr_base = 1.0
        self._dropped = -1
        """The step whose update the last rollback dropped."""

    @staticmethod
    def wanted_by(config) -> bool:
        """Whether a run's config keeps snapshots (``--on-anomaly rollback``, ``--rollback-every``)."""
        return config.on_anomaly == "rollback" or bool(config.rollback_every)

    @property
    def off(self) -> str | None:
        """Why no snapshot is kept (too big, shards, ranks without ptdash), or None."""
        return self.keeper.off

    @property
    def at_step(self) -> bool:
        """Whether every step is judged before its update (the state is on CPU)."""
        return self.keeper.at_step

    def can_restore(self) -> bool:
        """Whether a rollback can put a state back, now or once a snapshot is taken: the run
        keeps them, and has a torch.optim optimizer (else an anomaly pauses instead)."""
        d = self._discovery
        return self.keeper.off is None and bool(d.live(d.optimizers))

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
        if self.acting and self.keeper.at_step:
            self._judge.warm_up(step, self._ended_losses())
        self.keeper.step_end(step, self.verified)
        return self.due

    def _stopped(self, why: str) -> None:
        """The keeper keeps no snapshot from now on: an anomaly pauses instead."""
        self._journal.event(events.Warned(text=why), f"rollback off: {why}; an anomaly pauses the run instead")

    def before_update(self, step: int, finding: Finding) -> None:
        """A bad step found before its update (CPU): roll back now, or (DDP) vote for it and
        let the exchange decide. The update under way is dropped when alone."""
        if step == self._dropped:
            return  # a step whose update a rollback at its boundary dropped: its values are the ruined state's
        self._judge.exclude(step)
        if not self.local:
            if self.wanted is None:
                self.wanted = (step, finding.text())
            return
        self.restore(step, step, finding.text())

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
        """Put the good state back and drop the gradients of the update of ``step``: the
        newest snapshot taken before ``first``, the first bad step (``why`` says what it was)."""
        keeper = self.keeper
        self.wanted, self._dropped = None, step
        if self.local:  # the flush that found the bad step judged every step up to it
            keeper.promote_through(min(self.verified, first - 1))
        keeper.drop_pending()
        self._judge.close(first, step)
        try:
            good = keeper.put_back()
        except ValueError as exc:
            keeper.stop(str(exc))
            return
        if good is None:
            self._journal.event(events.Rollback(step=step, from_step=first, why=why, skipped=1, undone=0),
                                f"{why}: {self._nothing()}; the update of step {step} is skipped")
            return
        skipped, undone = step - good.step, step - 1 - good.step
        self._times = [s for s in self._times if s > step - self._limit[1]] + [step]
        lowered = self._lower_lr(step)
        self._journal.event(events.Rollback(step=step, from_step=first, to_step=good.step, why=why, skipped=skipped,
                                            undone=undone, lr_scale=self._settings.lr_scale if lowered else None),
                            f"{why}: rolled back to step {good.step}, {skipped} batch{'es' if skipped != 1 else ''} "
                            f"skipped ({undone} applied update{_s(undone)} undone)"
                            + (f"; LR factor {self._settings.lr_scale:g} until step {self._lr_until}" if lowered else ""))
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

    def observed(self, rows: list, findings: list[Finding]) -> None:
        """A flush's rows were judged (``findings``: its bad steps): every step before the first
        bad one is known sound, so a pending snapshot up to it may be promoted (a GPU)."""
        if findings:
            self.verified = max(self.verified, findings[0].step - 1)
        elif rows:
            self.verified = max(self.verified, rows[-1][0])

    def asked(self, finding: Finding) -> bool:
        """A bad step found at the flush (its update applied): roll back at the next step
        boundary, to the newest snapshot before it. False when it cannot (kept off)."""
        if not self.acting or not self.can_restore():
            return False
        if self.wanted is None:
            self._judge.exclude(finding.step)
            self.wanted, self._wanted_due = (finding.step, f"{finding.text()}, seen at the flush"), True
        return True


def _s(n: int) -> str:
    return "" if n == 1 else "s"
