"""Flush-time rules over the host rows of a run: a learning rate stuck at zero, a loss plateau."""

from __future__ import annotations

import math
import statistics

from ..shared.names import LOSS, MAIN_LR_PREFIX


class LrZero:
    """An LR of exactly 0 in some param group for ``steps`` steps in a row.

    A single zero step is normal: warmup schedules start at 0, linear decay ends at 0.
    """

    def __init__(self, steps: int = 10) -> None:
        self.steps = steps
        self._run: dict[str, list[int]] = {}

    def add(self, rows: list) -> dict | None:
        """Feed a flush's rows; ``{group: (first, last step)}`` once some group qualifies."""
        found = {}
        for step, _wall, values in rows:
            for name, value in values.items():
                if name.startswith(MAIN_LR_PREFIX):
                    if value == 0.0:
                        run = self._run.setdefault(name, [step, step])
                        run[1] = step
                        if run[1] - run[0] + 1 >= self.steps:
                            found[name.removeprefix(MAIN_LR_PREFIX)] = tuple(run)
                    else:
                        self._run.pop(name, None)
        return found or None


class Plateau:
    """The loss has not improved for ``max(min_steps, fraction * step)`` steps, and is not rising.

    Robust against noise: the loss is judged by the median of each block of ``block``
    steps, and a block improves on the best only if it beats it by ``rel_tol`` of its size.
    A loss that rises (a policy-gradient loss grows as returns do: the latest blocks above
    the best by more than the loss's own noise) is not meant to descend: it never makes a
    plateau.
    """

    def __init__(self, block: int = 50, min_steps: int = 500, fraction: float = 0.3, rel_tol: float = 0.01) -> None:
        self.block, self.min_steps, self.fraction, self.rel_tol = block, min_steps, fraction, rel_tol
        self._values: list[float] = []
        self._block_start: int | None = None
        self.best: float | None = None
        self.best_steps: tuple[int, int] | None = None
        self.last: float | None = None
        self._noise: list[float] = []
        """The spread (median absolute deviation) inside each block so far."""

    def add(self, rows: list) -> dict | None:
        """Feed a flush's rows; what was seen once the loss has plateaued."""
        for step, _wall, values in rows:
            loss = values.get(LOSS)
            if loss is None or not math.isfinite(loss):
                continue
            if self._block_start is None:
                self._block_start = step
            self._values.append(loss)
            if len(self._values) >= self.block:
                self.last = median = statistics.median(self._values)
                self._noise.append(statistics.median(abs(v - median) for v in self._values))
                if self.best is None or self.last < self.best - self.rel_tol * abs(self.best):
                    self.best, self.best_steps = self.last, (self._block_start, step)
                self._values, self._block_start = [], None
            if self.best_steps is not None:
                stale = step - self.best_steps[1]
                if stale >= max(self.min_steps, self.fraction * step) and not self._rising():
                    return {"best": self.best, "best_steps": list(self.best_steps), "now": self.last,
                            "step": step, "stale_steps": stale}
        return None

    def _rising(self) -> bool:
        """The latest block sits above the best by more than the loss's own noise."""
        noise = statistics.median(self._noise) if self._noise else 0.0
        return self.last is not None and self.last > self.best + max(2 * self.rel_tol * abs(self.best), noise)


class Trends:
    """``lr-zero`` and ``loss-plateau`` over each flush's rows (flusher thread)."""

    def __init__(self, report) -> None:
        self._report = report
        self.lr_zero, self.plateau = LrZero(), Plateau()

    def on_rows(self, rows: list, opt_name: str) -> None:
        zero = self.lr_zero.add(rows)
        if zero:
            groups = sorted(zero, key=int)
            first, last = zero[groups[0]]
            self._report("lr-zero", f"the learning rate of param group(s) {', '.join(groups)} of {opt_name} "
                         f"was 0 at every step from {first} to {last} while the optimizer stepped",
                         step=first, groups=[int(g) for g in groups])
        plateau = self.plateau.add(rows)
        if plateau:
            a, b = plateau["best_steps"]
            self._report("loss-plateau", f"the loss has not improved by {self.plateau.rel_tol:.0%} in "
                         f"{plateau['stale_steps']} steps: median {plateau['best']:.4g} over steps {a}-{b}, "
                         f"{plateau['now']:.4g} over the latest {self.plateau.block} (step {plateau['step']})",
                         **plateau)
