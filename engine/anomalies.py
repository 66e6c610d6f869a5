"""Anomalies: the one non-finite path, loss spikes, and per-layer gradient flags.

A non-finite loss or gradient is handled once, wherever it is seen first:

- on CPU the hot path sees it before the update (reading two CPU scalars waits for
  nothing) and ``before_update`` pauses, skips or warns, as ``--on-anomaly`` says;
- off the CPU that read would be a host sync per step, so ``at_flush`` sees it a flush
  later and, for ``pause``, asks for a pause at the next step.

Loss spikes and layer flags are judged at the flush too, on host values, so they cost
training nothing. Each finding becomes an event once, not once per step.
"""

from __future__ import annotations

import collections
import math
import statistics
from dataclasses import dataclass
from typing import Callable

from .shared.events import Anomaly, EventData, Warned
from .shared.names import GRAD_NORM, LOSS
from .shared.numbers import ema
from .shared.protocol import Command

SPIKE_Z = 8.0
"""Robust standard deviations (1.4826 x the median absolute deviation) above the recent
median that a loss must be to count as a spike."""
SPIKE_SPACING = 500
"""Steps between two spike events."""
MAX_SPIKES = 3
"""Spike events per run; after these, one more says that further ones are not reported."""


@dataclass(frozen=True)
class Thresholds:
    """When a value is worth flagging."""

    spike_factor: float = 3.0
    """A loss above this multiple of its running average is a spike."""
    vanishing: float = 1e-7
    """A parameter's gradient norm below this is vanishing."""
    exploding: float = 1e3
    """A parameter's gradient norm above this is exploding..."""
    jump: float = 20.0
    """...and so is one above this multiple of its own running average."""
    warmup_steps: int = 20
    """Running averages need this many steps before they judge anything."""

    def __post_init__(self) -> None:
        for name in ("spike_factor", "vanishing", "exploding", "jump"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value}")


class Anomalies:
    """Keeps running averages across flushes and journals what it finds.

    ``event(data, message)`` journals (events.py); ``action`` is ``--on-anomaly``;
    ``pause_here(step, reason)`` blocks the training thread in a pause;
    ``request_pause(command)`` queues a pause for the next step boundary;
    ``names(params)`` names parameters.
    """

    def __init__(self, event: Callable[..., object], action: str, pause_here: Callable[[int, str], None],
                 request_pause: Callable[[Command], None], is_paused: Callable[[], bool],
                 names: Callable[[list], list[str]], thresholds: Thresholds = Thresholds()) -> None:
        self._event, self.action, self._pause_here = event, action, pause_here
        self._request_pause, self._is_paused, self._names = request_pause, is_paused, names
        self._handled: set[int] = set()
        """Steps whose non-finite values were handled before their update."""
        self.t = thresholds
        self._loss_avg: float | None = None
        self._loss_seen = 0
        self._last_spike_step = -10**9
        self._spikes = 0
        self._recent: collections.deque[float] = collections.deque(maxlen=200)
        self.judge_loss = True
        """Whether loss spikes are judged here (rank 0's only: the loss is the run's, not the rank's)."""
        self._layer_avg: list[float] | None = None
        self._layer_seen = 0
        self._flagged: set[tuple[int, str]] = set()
        self._nonfinite_reported = False
        self.rollback = None
        """The rollback part (rollback.py), when the run keeps snapshots."""

    # ---------------------------------------------------------- training thread

    def before_update(self, opt, step: int, per_tensor, params: list) -> None:
        """A non-finite loss or gradient before step ``step``'s update (CPU: exact).

        Pauses there (until resumed or stopped), drops the update, or only warns. Blocks
        the training thread while paused.
        """
        if self._report(step, per_tensor, params):
            for group in opt.param_groups:
                for p in group["params"]:
                    p.grad = None  # the optimizer skips parameters without gradients

    def before_manual_update(self, step: int, per_tensor, params: list) -> None:
        """The same after a backward of optimizer-less training, before the script's own
        update: dropping it means zeroing the gradients that update would add."""
        if self._report(step, per_tensor, params):
            for p in params:
                if p.grad is not None:
                    p.grad.zero_()

    def _report(self, step: int, per_tensor, params: list) -> bool:
        """Journal the anomaly, pause if asked; whether the update must be dropped."""
        import torch

        name = "the loss"
        if per_tensor is not None and per_tensor.numel():
            bad = (~torch.isfinite(per_tensor)).nonzero()
            if bad.numel():
                name = self._names(params)[int(bad[0])]
        self._handled.add(step)
        action = self.acting()
        self._event(Anomaly(step=step, layer=name, action=action),
                    f"non-finite gradient before the update of step {step}, first in {name}"
                    + {"pause": "; paused before the update", "skip": "; update skipped", "warn": "",
                       "rollback": "; rolling back"}[action])
        if action == "warn":
            return False
        if action == "rollback":
            self.rollback.before_update(step, f"non-finite gradient (first in {name})")
            return True
        if action == "pause":
            self._pause_here(step - 1, name)
            self._event(Anomaly(step=step), f"skipped the non-finite update of step {step}")
        return True

    def acting(self) -> str:
        """What a non-finite step does now: ``--on-anomaly``, or a pause when rollback is
        asked for but no snapshot can be kept (too big for ``--rollback-memory``)."""
        if self.action == "rollback" and (self.rollback is None or self.rollback.off is not None):
            return "pause"
        return self.action

    # ----------------------------------------------------------- flusher thread

    def check_rows(self, rows: list[list]) -> list[tuple[EventData, str]]:
        """Non-finite steps not handled before their update, and loss spikes, in a flush's rows.

        Returns ``(data, message)`` events; a non-finite step seen here under
        ``pause`` also asks for a pause at the next step.
        """
        events = []
        if self.rollback is not None:
            self.rollback.observe(rows)
        action = self.acting()
        for step, _wall, values in rows:
            nonfinite = (LOSS in values and values[LOSS] is None) or (
                GRAD_NORM in values and values[GRAD_NORM] is None)
            if nonfinite and step not in self._handled:
                if action == "pause":
                    if not self._is_paused():  # paused, or a pause already asked for
                        events.append((Anomaly(step=step, action="pause"),
                                       f"non-finite loss or gradient at step {step}, seen at the flush; "
                                       "pausing at the next step"))
                        self._request_pause(Command(id=f"anomaly-{step}", name="pause"))
                elif not self._nonfinite_reported:
                    self._nonfinite_reported = True
                    events.append((Anomaly(step=step), f"non-finite loss or gradient at step {step}"))
            loss = values.get(LOSS)
            if loss is not None and self.judge_loss:
                spike = self._spike(step, loss)
                if spike is not None:
                    events.append(spike)
                self._loss_avg = ema(self._loss_avg, loss, 0.05)
                self._loss_seen += 1
                self._recent.append(loss)
        for what, message in events:
            self._event(what, message)
        return events

    def _spike(self, step: int, loss: float) -> tuple[EventData, str] | None:
        """A loss far outside its own recent noise: ``spike_factor`` times its running
        average, and more than SPIKE_Z robust deviations above its recent median. A noisy
        loss (reinforcement learning) moves its median and spread with it; a spike does not."""
        avg, t = self._loss_avg, self.t
        if (avg is None or self._loss_seen < t.warmup_steps or avg <= 0 or loss <= t.spike_factor * avg
                or step - self._last_spike_step < SPIKE_SPACING or self._spikes > MAX_SPIKES):
            return None
        median = statistics.median(self._recent)
        spread = 1.4826 * statistics.median(abs(v - median) for v in self._recent)
        if loss <= median + SPIKE_Z * spread:
            return None
        self._last_spike_step = step
        self._spikes += 1
        if self._spikes > MAX_SPIKES:
            return Anomaly(step=step), f"loss spike at step {step}; further spikes are not reported"
        return (Anomaly(step=step, loss=loss, average=avg),
                f"loss spike at step {step}: {loss:.4g} is {loss / avg:.1f}x its running average {avg:.4g}")

    def check_layers(self, step: int, names: list[str], norms: list[float | None]) -> tuple[dict, list]:
        """Flags for one step's per-parameter gradient norms, and events for new flags."""
        t = self.t
        if self._layer_avg is None or len(self._layer_avg) != len(norms):
            self._layer_avg, self._layer_seen = [0.0] * len(norms), 0
        flags: dict[str, str] = {}
        for i, norm in enumerate(norms):
            if norm is None:
                flags[str(i)] = "nonfinite"
                continue
            avg = self._layer_avg[i]
            if norm < t.vanishing:
                flags[str(i)] = "vanishing"
            elif norm > t.exploding or (self._layer_seen >= t.warmup_steps and avg > 0 and norm > t.jump * avg):
                flags[str(i)] = "exploding"
            self._layer_avg[i] = ema(avg if self._layer_seen else None, norm, 0.1)
        self._layer_seen += 1
        events = []
        for flag in ("nonfinite", "exploding", "vanishing"):
            new = [int(i) for i, f in flags.items() if f == flag and (int(i), flag) not in self._flagged]
            if new:
                first = min(new)
                self._flagged.update((i, flag) for i in new)
                name = names[first] if first < len(names) else f"#{first}"
                more = f" and {len(new) - 1} more" if len(new) > 1 else ""
                what = Anomaly if flag != "vanishing" else Warned
                events.append((what(flag=flag, layer=name, count=len(new)), f"{flag} gradient at step {step}: {name}{more}"))
        return flags, events
