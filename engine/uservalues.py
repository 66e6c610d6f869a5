"""The values a script gives ``ptdash.log``: kept for the next step's record, or, given a
``step`` of their own, for the flusher to store at that step."""

from __future__ import annotations

import threading

import torch

from .shared import names


class UserValues:
    """Values given to ``ptdash.log`` (any thread), taken by the next step's record; those
    given with a ``step`` of their own are stored at that step (``drain_at``, by the flusher)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.pending: dict = {}
        self._at: list[tuple[int, dict]] = []
        self._taken: dict = {}
        """The values the last step's record took (its names are that step's already)."""
        self.names: set[str] = set()
        """The names given so far, lower case: a printed metric of the same name is left out (printed.py)."""

    def log(self, values: dict, step: int | None = None) -> None:
        """``step``: an int >= 0, or None for the step in progress (anything else is a TypeError
        or ValueError, which ``Engine.log`` reports instead of raising into the script)."""
        if step is not None:
            if isinstance(step, bool) or not isinstance(step, int) and not _is_int_tensor(step):
                raise TypeError(f"step must be an int, not {type(step).__name__}")
            step = int(step)
            if step < 0:
                raise ValueError(f"step must be >= 0, not {step}")
        with self._lock:
            target = self.pending if step is None else {}
            for name, value in values.items():
                target[names.user(name)] = value
                self.names.add(str(name).lower())
            if step is not None and target:
                self._at.append((step, target))

    def settle(self, step: int) -> None:
        """The run ends: the values given since the last step's record (after the loop, say a
        final test score) are kept at that last ``step``, not lost with a next record that
        never comes; a name that step holds already keeps the value it has (one per step)."""
        with self._lock:
            left = {name: v for name, v in self.pending.items() if name not in self._taken}
            self.pending = {}
            if left:
                self._at.append((step, left))

    def drain_at(self) -> list[tuple[int, dict]]:
        """The values given with a step since the last drain, ``(step, {name: float})``, on the
        host (the flusher's thread pays for the copy)."""
        with self._lock:
            at, self._at = self._at, []
        return [(step, {name: float(v.detach()) if isinstance(v, torch.Tensor) else float(v) for name, v in vals.items()})
                for step, vals in at]

    def take(self) -> dict:
        """The values since the previous step (tensors stay on their device)."""
        with self._lock:
            values, self.pending = self.pending, {}
            self._taken = values
        return {name: value.detach().reshape(()) if isinstance(value, torch.Tensor) else float(value)
                for name, value in values.items()}


def _is_int_tensor(value) -> bool:
    return isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point()
