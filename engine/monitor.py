"""Host-side analysis of each flush: loss spikes and per-layer gradient flags.

Runs on the flusher thread over values already on the host, so it costs training
nothing. Each finding becomes an event once (rate-limited), not once per step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .shared.numbers import ema


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


class Monitor:
    """Keeps running averages across flushes and returns new findings as events."""

    def __init__(self, thresholds: Thresholds = Thresholds()) -> None:
        self.t = thresholds
        self._loss_avg: float | None = None
        self._loss_seen = 0
        self._last_spike_step = -10**9
        self._layer_avg: list[float] | None = None
        self._layer_seen = 0
        self._flagged: set[tuple[int, str]] = set()
        self._nonfinite_reported = False

    def check_rows(self, rows: list[list]) -> list[tuple[str, str, dict]]:
        """Loss spikes and non-finite losses in a flush's step rows.

        Returns ``(kind, message, data)`` events.
        """
        events = []
        for step, _wall, values in rows:
            if "loss" in values:
                loss = values["loss"]
                if loss is None:
                    if not self._nonfinite_reported:
                        self._nonfinite_reported = True
                        events.append(("anomaly", f"non-finite loss at step {step}", {"step": step}))
                else:
                    avg = self._loss_avg
                    if (avg is not None and self._loss_seen >= self.t.warmup_steps and avg > 0
                            and loss > self.t.spike_factor * avg and step - self._last_spike_step >= 100):
                        self._last_spike_step = step
                        events.append(("anomaly", f"loss spike at step {step}: {loss:.4g} is "
                                                  f"{loss / avg:.1f}x its running average {avg:.4g}",
                                       {"step": step, "loss": loss, "average": avg}))
                    self._loss_avg = ema(avg, loss, 0.05)
                    self._loss_seen += 1
        return events

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
                events.append(("anomaly" if flag != "vanishing" else "warning",
                               f"{flag} gradient at step {step}: {name}{more}",
                               {"flag": flag, "layer": name, "count": len(new)}))
        return flags, events
