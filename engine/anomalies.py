"""Anomalies: what the run does about a bad step the judge found (judge.py), said once.

Every bad step has one event, naming the step and what was done about it, in one sentence:

- before its update (the values on the CPU): ``--on-anomaly pause`` pauses there, and a
  resume goes on without its update; ``skip`` drops the update; ``rollback`` puts the last
  good state back (rollback.py, whose event it is); ``warn`` only says so;
- found at the flush (a GPU's values, a flush after the step): the update was applied, and the
  event says so; ``rollback`` restores a snapshot taken before the bad step at the next step
  boundary, ``pause`` pauses at the next step;
- under DDP a rank cannot pause or skip alone (the others would wait in their next
  collective, or the replicas would differ): rank 0 judges the spikes and asks every rank to
  pause at the next exchange, and the update is applied; a rollback is voted (rollback.py).

With rollback asked for but kept off (the state over ``--rollback-memory``, shards, no
optimizer), a bad step pauses instead, finite spikes as non-finite values. Per-layer
gradient flags (``check_layers``) mark the Layers tab; only a vanishing gradient is said, as
a warning, and a shard that holds no data is not vanishing.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable

from .judge import Finding, Judge
from .shared.events import Anomaly, EventData, Warned
from .shared.numbers import ema
from .shared.protocol import Command

@dataclass(frozen=True)
class Thresholds:
    """When a value is worth flagging."""

    vanishing: float = 1e-7
    """A parameter's gradient norm below this is vanishing."""
    exploding: float = 1e3
    """A parameter's gradient norm above this is exploding..."""
    jump: float = 20.0
    """...and so is one above this multiple of its own running average."""
    warmup_steps: int = 20
    """Running averages need this many steps before they judge anything."""

    def __post_init__(self) -> None:
        for name in ("vanishing", "exploding", "jump"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value}")


class Anomalies:
    """Acts on the judge's findings as ``--on-anomaly`` says, and journals them (module docstring).

    ``event(data, message)`` journals (events.py); ``action`` is ``--on-anomaly``;
    ``pause_here(step, reason)`` blocks the training thread in a pause;
    ``request_pause(command)`` queues a pause for the next step boundary (every rank's);
    ``is_paused()`` whether one is in force or asked for; ``names(params)`` names parameters;
    ``judge`` is the one judge; ``multi()`` whether the run has several ranks;
    ``rollback()`` the rollback part (rollback.py), or None when the run keeps no snapshot.
    """

    def __init__(self, *, event: Callable[..., object], action: str, pause_here: Callable[[int, str], None],
                 request_pause: Callable[[Command], None], is_paused: Callable[[], bool],
                 names: Callable[[list], list[str]], judge: Judge, multi: Callable[[], bool] = lambda: False,
                 rollback: Callable[[], object] = lambda: None, thresholds: Thresholds = Thresholds()) -> None:
        self._event, self.action, self._pause_here = event, action, pause_here
        self._request_pause, self._is_paused, self._names = request_pause, is_paused, names
        self.judge, self._multi, self._rollback = judge, multi, rollback
        self.t = thresholds
        self._layer_avg: list[float] | None = None
        self._layer_seen = 0
        self._flagged: set[tuple[int, str]] = set()

    @property
    def rollback(self):
        """The rollback part, or None."""
        return self._rollback()

    def acting(self) -> str:
        """What a bad step does now: ``--on-anomaly``, or a pause when rollback is asked for
        but no snapshot can be kept (too big for ``--rollback-memory``, shards, no optimizer)."""
        if self.action == "rollback":
            part = self.rollback
            if part is None or part.off is not None or not part.can_restore():
                return "pause"
        return self.action

    # ---------------------------------------------------------- training thread

    def before_update(self, opt, step: int, per_tensor, params: list, finding: Finding | None = None) -> None:
        """A bad step before step ``step``'s update (CPU: exact): ``finding``, or a non-finite
        loss or gradient (first in the parameter ``per_tensor`` names). Pauses there (until
        resumed or stopped), drops the update, rolls back, or only warns; blocks the training
        thread while paused."""
        if self._act(finding or self._nonfinite(step, per_tensor, params)):
            for group in opt.param_groups:
                for p in group["params"]:
                    p.grad = None  # the optimizer skips parameters without gradients

    def before_manual_update(self, step: int, per_tensor, params: list) -> None:
        """The same after a backward of optimizer-less training, before the script's own
        update: dropping it means zeroing the gradients that update would add."""
        if self._act(self._nonfinite(step, per_tensor, params)):
            for p in params:
                if p.grad is not None:
                    p.grad.zero_()

    def _nonfinite(self, step: int, per_tensor, params: list) -> Finding:
        import torch

        name = "the loss"
        if per_tensor is not None and per_tensor.numel():
            bad = (~torch.isfinite(per_tensor)).nonzero()
            if bad.numel():
                name = self._names(params)[int(bad[0])]
        return self.judge.nonfinite(step, name)

    def _act(self, finding: Finding) -> bool:
        """Act on a bad step before its update and say so once; whether the update is dropped."""
        step, action = finding.step, self.acting()
        data = Anomaly(step=step, action=action, layer=finding.where, what=finding.what, value=finding.value,
                       limit=finding.limit)
        if action == "rollback":
            self.rollback.before_update(step, finding)  # its rollback event is the one said
            return True
        if self._multi() and finding.spike:
            data = dataclasses.replace(data, applied=True)
            # One rank cannot pause or skip alone; rank 0 asks every rank to pause.
            if action == "pause" and not self._is_paused():
                self._request_pause(Command(id=f"anomaly-{step}", name="pause"))
                self._event(data, f"{finding.text()}; its update was applied (the ranks pause together, "
                                  "at the next exchange)")
            else:
                self._event(replace_action(data, "warn"), f"{finding.text()}; its update was applied "
                                                          "(under DDP a rank does not skip alone)")
            return False
        if action == "warn":
            self._event(data, f"{finding.text()}; warned only, the update was applied")
            return False
        if action == "pause":
            self._event(data, f"{finding.text()}; paused before the update, which a resume skips")
            self._pause_here(step - 1, finding.where or finding.what)
            return True
        self._event(data, f"{finding.text()}; update skipped")
        return True

    # ----------------------------------------------------------- flusher thread

    def check_rows(self, rows: list[list]) -> list[tuple[EventData, str]]:
        """A flush's rows: the judge's verdicts on the steps not judged before their update
        (their updates were applied), acted on. Returns the ``(data, message)`` events said."""
        findings = self.judge.observe(rows)
        part = self.rollback
        if part is not None:
            part.observed(rows, findings)
        action = self.acting()
        events = []
        for finding in findings:
            data = Anomaly(step=finding.step, action=action, layer=finding.where, what=finding.what,
                           value=finding.value, limit=finding.limit, applied=True)
            if action == "rollback":
                if part.asked(finding):  # restored at the next boundary; its rollback event says it
                    continue
                action = "pause"
                data = replace_action(data, action)
            if action == "pause":
                if self._is_paused():  # paused, or a pause already asked for
                    continue
                self._request_pause(Command(id=f"anomaly-{finding.step}", name="pause"))
                events.append((data, f"{finding.text()}, seen at the flush; its update was applied; "
                                     "pausing at the next step"))
            else:
                events.append((data, f"{finding.text()}, seen at the flush; its update was applied"))
        for what, message in events:
            self._event(what, message)
        return events

    def check_layers(self, step: int, names: list[str], norms: list[float | None],
                     held: list[bool] | None = None) -> tuple[dict, list]:
        """Flags for one step's per-parameter gradient norms, and a warning for each newly
        vanishing gradient. ``held``: of shards (FSDP), whether this rank's shard of each holds
        data; an empty shard's norm is no vanishing gradient, and a shard's is named as one.
        Non-finite and exploding flags mark the Layers tab only: the judge's finding is the
        step's one event."""
        t = self.t
        if self._layer_avg is None or len(self._layer_avg) != len(norms):
            self._layer_avg, self._layer_seen = [0.0] * len(norms), 0
        flags: dict[str, str] = {}
        for i, norm in enumerate(norms):
            if norm is None:
                flags[str(i)] = "nonfinite"
                continue
            if held is not None and not held[i]:
                continue  # no data on this rank: nothing to judge
            avg = self._layer_avg[i]
            if norm < t.vanishing:
                flags[str(i)] = "vanishing"
            elif norm > t.exploding or (self._layer_seen >= t.warmup_steps and avg > 0 and norm > t.jump * avg):
                flags[str(i)] = "exploding"
            self._layer_avg[i] = ema(avg if self._layer_seen else None, norm, 0.1)
        self._layer_seen += 1
        new = [int(i) for i, f in flags.items() if f == "vanishing" and (int(i), f) not in self._flagged]
        if not new:
            return flags, []
        first = min(new)
        self._flagged.update((i, "vanishing") for i in new)
        name = names[first] if first < len(names) else f"#{first}"
        shard = " (this rank's shard)" if held is not None else ""
        more = f" and {len(new) - 1} more" if len(new) > 1 else ""
        return flags, [(Warned(flag="vanishing", layer=name, count=len(new)),
                        f"vanishing gradient at step {step}: {name}{shard}{more}")]


def replace_action(data: Anomaly, action: str) -> Anomaly:
    """``data`` with another action."""
    return dataclasses.replace(data, action=action)
