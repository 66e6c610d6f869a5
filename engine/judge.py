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
range's never do, so one wild batch does not raise the limits. Pure Python, no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from .shared.names import GRAD_NORM, LOSS
from .spikes import WARMUP, Window

KEPT_RANGES = 16
"""Step ranges left out of the windows (rolled back) that are remembered."""


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
    (``StepState.loss_max``); ``judge_loss``: whether this rank judges the loss (the loss is
    the run's under DDP, each rank's its own batch's: rank 0 judges it, unless ranks vote).
    """

    def __init__(self, *, limit_to: Callable[[float], None], judge_loss: bool = True) -> None:
        self._limit_to = limit_to
        self.judge_loss = judge_loss
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
        self._incident = False
        """Whether the newest judged row was bad and reported (a flush's run of non-finite rows
        after an update that was applied is one incident, reported once)."""

    # ------------------------------------------------------------- training thread

    def at_step(self, step: int, losses: list, norm: float | None) -> Finding | None:
        """The verdict on step ``step`` before its update, from its CPU ``losses`` and gradient
        ``norm`` (read already, or None): a spike's Finding, or None. Non-finite values are the
        caller's (``nonfinite``)."""
        self.on_cpu = True
        if self.judge_loss:
            for loss in losses:
                value = _value(loss)
                if value is not None and value > self.loss.limit:
                    return self._found(Finding(step, "loss spike", value, self.loss.limit))
        if norm is not None:
            if self.norm.over(norm, self._norm_before):
                return self._found(Finding(step, "gradient norm spike", norm, self.norm.limit))
            self._norm_before = norm
        return None

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
        if self.loss.limit < math.inf or not self.judge_loss or self.left_out(step):
            return
        for loss in ended_losses:
            value = _value(loss)
            if value is not None and math.isfinite(value):
                self._early.append(value)
        if len(self._early) >= WARMUP and step % 8 == 0:
            self.loss.early(self._early[-WARMUP * 4:])
            self._early = self._early[-WARMUP * 4:]
            self._limit_to(self.loss.limit)

    # ------------------------------------------------------------ flusher thread

    def observe(self, rows: list) -> list[Finding]:
        """A flush's ``[step, wall, values]`` rows: the verdicts on the steps not judged before
        their update (Findings with ``before_update`` False), and every good value kept in the
        windows; then the limits are taken again."""
        found = []
        for step, _wall, values in rows:
            if step in self._bad or self.left_out(step):
                continue
            loss, norm = values.get(LOSS), values.get(GRAD_NORM)
            nonfinite = (LOSS in values and loss is None) or (GRAD_NORM in values and norm is None)
            judged = self.on_cpu and step not in self.owed
            self.owed.discard(step)
            if nonfinite:
                # A CPU step's non-finite values were handled before its update (``nonfinite``);
                # the rows after a bad update that was applied are the same incident.
                if not judged and not self._incident:
                    found.append(self.nonfinite(step, before_update=False))
                self._incident = True
                continue
            if not judged:
                finding = None
                if loss is not None and self.judge_loss and self.loss.over(loss):
                    finding = Finding(step, "loss spike", loss, self.loss.limit, before_update=False)
                elif norm is not None and self.norm.over(norm, self.norm.newest):
                    finding = Finding(step, "gradient norm spike", norm, self.norm.limit, before_update=False)
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
        if self.judge_loss:
            self._limit_to(self.loss.update())
        self.norm.update()
        return found

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
