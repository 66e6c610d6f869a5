"""The one anomaly judge: whether a step's loss or gradient norm is bad, for every consumer.

A step is bad when its loss or total gradient norm is non-finite, or a spike: far outside
the rolling window of the good values before it (spikes.py: the median plus 8 robust
deviations, and 3 times as far above it as the window's highest value; a gradient norm
must also have jumped there). Pausing, skipping, rolling back and warning (anomalies.py,
rollback.py), the events that the headless line, the dashboard, ``show --once`` and the
doctor read: all of them act on this judge's findings, and on nothing else.

Where it decides:

- on the training thread, before the update, where the values are on the CPU: a CPU loss is
  read for nothing (``at_step``; the lean path compares it with ``loss_max`` first);
- at the flush, from the host copies of the rows the flusher moves anyway, for the steps
  that were not judged before their update (a GPU's values: reading them on the training
  thread would be a host sync per step; a closure's steps). The verdict comes then a flush
  after the step, and the update was applied (``observe``).

Every good value goes into the windows at the flush; a bad step's values and a rolled-back
range's never do, so one wild batch does not raise the limits. When the main optimizer's LR
jumps (a command, a warm restart of the script's schedule) the loss may rise with it: a
spike then is taken for a new regime, and the judge learns it again from its next WARMUP
steps (``relearn``) instead of raising an alarm. Pure Python, no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from .shared.names import GRAD_NORM, LOSS, MAIN_LR_PREFIX
from .spikes import WARMUP, Window

KEPT_RANGES = 16
"""Step ranges left out of the windows (rolled back) that are remembered."""
LR_JUMP = 1.5
"""The main LR this many times the one the windows were learned at is a new regime."""
MAIN_LR = MAIN_LR_PREFIX + "0"


@dataclass(frozen=True)
class Finding:
    """One bad step: ``what`` it was (``non-finite`` or a ``loss spike`` or ``gradient norm
    spike``), its ``value`` and the ``limit`` it passed (spikes), the parameter ``where`` a
    non-finite gradient was first seen, and whether it was judged before its update."""

    step: int
    what: str
    value: float | None = None
    limit: float | None = None
    where: str | None = None
    before_update: bool = True

    @property
    def spike(self) -> bool:
        """Whether the values were finite (a spike) rather than non-finite."""
        return self.what != "non-finite"

    def text(self) -> str:
        """What was bad, in words: ``loss spike at step 151 (7.13e+07, over the limit 0.0412 of
        its recent values)``, ``non-finite gradient before the update of step 6, first in 2.weight``."""
        if not self.spike:
            if self.before_update:
                return f"non-finite gradient before the update of step {self.step}, first in {self.where or 'the loss'}"
            return f"non-finite loss or gradient at step {self.step}"
        return f"{self.what} at step {self.step} ({self.value:.4g}, over the limit {self.limit:.4g} of its recent values)"


def _value(loss) -> float | None:
    """A loss as a float when reading it waits for nothing (a float, a CPU tensor), else None."""
    if type(loss) is float:
        return loss
    return loss.item() if loss.is_cpu else None


class Judge:
    """The windows of good values and the verdicts (module docstring).

    ``limit_to(value)`` tells the step boundary the loss above which a CPU loss must be judged
    (``StepState.loss_max``); ``step_now()`` is the training thread's step counter;
    ``spikes``: whether this rank judges spikes (under DDP rank 0 does, for the run, unless
    the ranks vote on a rollback: then every rank judges its own batch); non-finite values are
    judged on every rank.
    """

    def __init__(self, *, limit_to: Callable[[float], None], step_now: Callable[[], int] = lambda: 0,
                 spikes: bool = True) -> None:
        self._limit_to, self._step_now = limit_to, step_now
        self.spikes = spikes
        self.loss = Window()
        self.norm = Window()
        self.on_cpu = False
        """Whether the steps are judged before their update (their values are on the CPU)."""
        self._norm_before: float | None = None
        """The newest good norm the training thread judged (a norm must jump to be a spike)."""
        self.owed: set[int] = set()
        """Steps of CPU runs not judged before their update (a closure's): the flush judges them."""
        self._bad: set[int] = set()
        """Steps found bad (reported once, never learned from)."""
        self._excluded: list[list[float]] = []
        """[first, last] step ranges whose rows are left out of the windows (rolled back)."""
        self._early: list[float] = []
        self._lr: float | None = None
        """The main LR of the newest row the windows learned from."""
        self._relearn_from = 0
        """Rows before this step are of an earlier regime (an LR jump): not learned from."""
        self._unjudged_through: int | None = None
        """The training thread's step when the first limit was published: the CPU steps up to
        it met no limit before their update, so the flush judges them."""
        self._incident = False
        """Whether the newest judged row was bad and reported (a flush's run of non-finite rows
        after an update that was applied is one incident, reported once)."""

    # ------------------------------------------------------------- training thread

    def at_step(self, step: int, losses: list, norm: float | None, lr: float | None = None) -> Finding | None:
        """The verdict on step ``step`` before its update, from its CPU ``losses``, gradient
        ``norm`` (read already, or None) and the main optimizer's effective ``lr``: a spike's
        Finding, or None. Non-finite values are the caller's (``nonfinite``)."""
        self.on_cpu = True
        if not self.spikes:
            return None
        finding = None
        for loss in losses:
            value = _value(loss)
            if value is not None and value > self.loss.limit:
                finding = Finding(step, "loss spike", value, self.loss.limit)
                break
        if finding is None and norm is not None:
            if not self.norm.over(norm, self._norm_before):
                self._norm_before = norm
                return None
            finding = Finding(step, "gradient norm spike", norm, self.norm.limit)
        if finding is None:
            return None
        if lr is not None and self._lr is not None and lr > LR_JUMP * self._lr:
            self.relearn(step)  # the LR jumped since the windows learned: a new regime, no alarm
            return None
        return self._found(finding)

    def relearn(self, step: int) -> None:
        """A new regime from step ``step`` on (the LR jumped): the windows learn it again, and
        nothing is judged a spike until they have WARMUP values of it."""
        self.loss, self.norm = Window(), Window()
        self._norm_before, self._lr, self._early = None, None, []
        self._relearn_from = step
        self._limit_to(math.inf)

    def nonfinite(self, step: int, where: str | None = None, before_update: bool = True) -> Finding:
        """The Finding of a non-finite loss or gradient at ``step`` (first in ``where``)."""
        return self._found(Finding(step, "non-finite", where=where, before_update=before_update))

    def _found(self, finding: Finding) -> Finding:
        self._bad.add(finding.step)
        if len(self._bad) > 4096:
            self._bad = set(sorted(self._bad)[-1024:])
        return finding

    def owe(self, step: int) -> None:
        """Step ``step`` could not be judged before its update (a closure): the flush judges it."""
        self.owed.add(step)

    def warm_up(self, step: int, ended_losses: list) -> None:
        """Until the flush has a limit for the loss, take one from the losses seen at the steps'
        ends (CPU floats), so that fast steps are judged from the WARMUP-th step on, not from
        the first flush, which may come hundreds of steps later."""
        if self.loss.limit < math.inf or not self.spikes or self.left_out(step):
            return
        for loss in ended_losses:
            value = _value(loss)
            if value is not None and math.isfinite(value):
                self._early.append(value)
        if len(self._early) >= WARMUP and step % 8 == 0:
            self.loss.early(self._early[-WARMUP * 4:])
            self._early = self._early[-WARMUP * 4:]
            if self.loss.limit < math.inf:
                self._unjudged_through = step  # the steps before it were judged by none
                self._limit_to(self.loss.limit)

    # ------------------------------------------------------------ flusher thread

    def observe(self, rows: list) -> list[Finding]:
        """A flush's ``[step, wall, values]`` rows: the verdicts on the steps not judged before
        their update (Findings with ``before_update`` False), and every good value kept in the
        windows; then the limits are taken again, once a flush (rows judged here are judged by
        the values before them: ``Window.add`` takes the limits again every WARMUP of them)."""
        found = []
        bad, owed, excluded = self._bad, self.owed, self._excluded
        through = self._unjudged_through
        cpu = self.on_cpu and through is not None
        losses, norms = self.loss.values, self.norm.values  # a judged row's good values, appended as they are
        for step, _wall, values in rows:
            if step in bad or step < self._relearn_from or (excluded and self.left_out(step)):
                continue
            loss, norm = values.get(LOSS), values.get(GRAD_NORM)
            lr = values.get(MAIN_LR)
            if type(lr) is float:
                if self._lr is not None and lr > LR_JUMP * self._lr:
                    self.relearn(step)
                    losses, norms = self.loss.values, self.norm.values
                self._lr = lr
            judged = cpu and step > through and step not in owed
            if owed:
                owed.discard(step)
            if (loss is None and LOSS in values) or (norm is None and GRAD_NORM in values):
                # A CPU step's non-finite values were handled before its update (``nonfinite``);
                # the rows after a bad update that was applied are the same incident.
                if not judged and not self._incident:
                    found.append(self.nonfinite(step, before_update=False))
                self._incident = True
                continue
            if judged:
                self._incident = False
                if loss is not None:
                    losses.append(loss)
                if norm is not None:
                    norms.append(norm)
                continue
            finding = self._judged_here(step, loss, norm) if self.spikes else None
            if finding is not None:
                if not self._incident:
                    found.append(self._found(finding))
                self._incident = True
                continue
            self._incident = False
            if loss is not None:
                self.loss.add(loss)
            if norm is not None:
                self.norm.add(norm)
        if self.spikes:
            limit = self.loss.update()
            self.norm.update()
            if self._unjudged_through is None and min(limit, self.norm.limit) < math.inf:
                self._unjudged_through = self._step_now()  # from here on the training thread judges
            self._limit_to(limit)
        return found

    def _judged_here(self, step: int, loss: float | None, norm: float | None) -> Finding | None:
        """The flush's verdict on a row no one judged before its update (its update applied)."""
        if loss is not None and self.loss.over(loss):
            return Finding(step, "loss spike", loss, self.loss.limit, before_update=False)
        if norm is not None and self.norm.over(norm, self.norm.newest):
            return Finding(step, "gradient norm spike", norm, self.norm.limit, before_update=False)
        return None

    # ------------------------------------------------------ what is not learned from

    def exclude(self, first: int) -> None:
        """Leave out the rows from ``first`` on (a rollback is under way), until ``close``."""
        if not self._excluded or self._excluded[-1][1] != math.inf:
            self._excluded.append([first, math.inf])

    def close(self, first: int, last: int) -> None:
        """The rows of steps ``first`` to ``last`` were rolled back: left out of the windows."""
        if self._excluded and self._excluded[-1][1] == math.inf:
            self._excluded[-1] = [min(first, self._excluded[-1][0]), last]
        else:
            self._excluded.append([first, last])
        self._excluded = self._excluded[-KEPT_RANGES:]

    def left_out(self, step: int) -> bool:
        """Whether step ``step``'s values are left out of the windows (rolled back)."""
        return any(lo <= step <= hi for lo, hi in self._excluded)
