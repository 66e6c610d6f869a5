"""What the anomaly judge costs a step, whatever judge this ptdash has.

    python benchmarks/judge_cost.py [--calls 20000] [--rows 250] [--repeats 7] [--step-ms 2]

The judge decides on the training thread, before the update, where a step's loss is on the
CPU, and learns its limits from the rows the flusher moves (issue 44). This measures both,
on a healthy loss and gradient norm (noisy, seeded), in this process, one thread:

- **every step** (training thread): what the lean path pays for the verdict, the compare of
  the step's loss (read already for its finite check) with the judge's limit;
- **a judged step** (training thread): the verdict itself, with a loss and a gradient norm:
  what a sampled step pays (its norm is read there), and a step whose loss passed the limit;
- **per row** (flusher thread): a flush of ``--rows`` rows learned from (the windows, the
  limits taken again), per row. On a 2-core machine this holds the GIL while the training
  thread may want it, so it counts too (benchmarks/README.md: the GIL wait).

Each figure is the median (and min) over ``--repeats`` of the time per call (the thread's CPU
clock: other processes on the machine do not inflate it), and a share of
a ``--step-ms`` step (2 ms: overhead.py's ``wide`` workload, where the 1% budget is tightest).
The judge is found where it lives: ``ptdash.recovery.judge.Judge`` or ``ptdash.judge.Judge``
(one judge, at_step/observe); failing both, the rolling windows the rollback's judge ran on
(``spikes.Window``: over, add, update), the same median-and-spread rule.
"""

from __future__ import annotations

import argparse
import importlib
import math
import random
import statistics
import time
from typing import Callable


def _find_judge() -> tuple[str, object]:
    """(where the judge was found, an adapter with ``lean``, ``judged``, ``learn`` and ``reset``)."""
    for module in ("ptdash.recovery.judge", "ptdash.judge"):
        try:
            found = importlib.import_module(module)
        except ImportError:
            continue
        if hasattr(found, "Judge"):
            return f"{module}.Judge", _JudgeAdapter(found.Judge)
    for module in ("ptdash.recovery.spikes", "ptdash.spikes"):
        try:
            found = importlib.import_module(module)
        except ImportError:
            continue
        return f"{module}.Window (no one judge in this ptdash: the rollback's windows)", _WindowAdapter(found.Window)
    raise SystemExit("judge_cost: no anomaly judge found in this ptdash (ptdash.recovery.judge, ptdash.judge, "
                     "ptdash.spikes)")


class _JudgeAdapter:
    def __init__(self, cls) -> None:
        self._cls = cls
        self.limit = math.inf
        self.judge = None

    def reset(self) -> None:
        self.judge = self._cls(limit_to=self._limit_to)

    def _limit_to(self, value: float) -> None:
        self.limit = value  # the step boundary's loss_max: what the lean path compares with

    def judged(self, step: int, loss: float, norm: float) -> object:
        return self.judge.at_step(step, [loss], norm)

    def learn(self, rows: list) -> None:
        self.judge.observe(rows)


class _WindowAdapter:
    def __init__(self, cls) -> None:
        self._cls = cls

    def reset(self) -> None:
        self.loss, self.norm = self._cls(), self._cls()
        self.limit = math.inf
        self._before = None

    def judged(self, step: int, loss: float, norm: float) -> object:
        if loss > self.loss.limit:
            return "loss"
        if self.norm.over(norm, self._before):
            return "norm"
        self._before = norm
        return None

    def learn(self, rows: list) -> None:
        for _, _, values in rows:
            self.loss.add(values["loss"])
            self.norm.add(values["grad/norm_total"])
        self.limit = self.loss.update()
        self.norm.update()


def healthy(n: int, seed: int = 0) -> list[tuple[float, float]]:
    """``n`` steps of a noisy, slowly falling loss and its gradient norm (no spike)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        trend = 2.0 * math.exp(-i / 5000) + 0.2
        out.append((trend * (1 + 0.15 * rng.gauss(0, 1) ** 2), 0.5 * trend * (1 + 0.2 * abs(rng.gauss(0, 1)))))
    return out


def _timed(fn: Callable[[], None], calls: int, repeats: int) -> tuple[float, float]:
    """(median, min) seconds per call of ``fn`` run ``calls`` times, over ``repeats``: this
    thread's CPU time, which other processes on a shared machine do not inflate."""
    per = []
    for _ in range(repeats):
        t0 = time.thread_time()
        fn()
        per.append((time.thread_time() - t0) / calls)
    return statistics.median(per), min(per)


def measure(calls: int, rows: int, repeats: int) -> tuple[str, dict[str, tuple[float, float]]]:
    """The judge's place and its costs: ``lean``, ``judged`` (per step) and ``learn`` (per row)."""
    where, judge = _find_judge()
    values = healthy(calls + 4 * rows)
    warm = [[i + 1, 0.0, {"loss": loss, "grad/norm_total": norm}] for i, (loss, norm) in enumerate(values[:4 * rows])]
    steps = values[4 * rows:]
    start = 4 * rows + 1

    def ready() -> None:
        judge.reset()
        for i in range(0, len(warm), rows):  # the first flushes: limits to judge by
            judge.learn(warm[i:i + rows])

    ready()
    limit = judge.limit

    def lean() -> None:  # the lean path's compare (prestep.py: ``value > state.loss_max``)
        hits = 0
        for loss, _ in steps:
            if loss > limit:
                hits += 1

    def judged() -> None:
        at = judge.judged
        for i, (loss, norm) in enumerate(steps):
            at(start + i, loss, norm)

    flushes = [[[start + i, 0.0, {"loss": loss, "grad/norm_total": norm}] for i, (loss, norm) in
                enumerate(steps[j:j + rows], j)] for j in range(0, len(steps), rows)]

    def learn() -> None:
        for flush in flushes:
            judge.learn(flush)

    out = {"lean": _timed(lean, len(steps), repeats)}
    ready()
    out["judged"] = _timed(judged, len(steps), repeats)
    ready()
    out["learn"] = _timed(learn, len(steps), repeats)
    return where, out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20000, help="steps judged per repeat (default 20000)")
    parser.add_argument("--rows", type=int, default=250, help="rows per flush (default 250: 2 ms steps, 0.5 s)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--step-ms", type=float, default=2.0, help="the step the shares are of (default 2 ms)")
    args = parser.parse_args(argv)
    where, costs = measure(args.calls, args.rows, args.repeats)
    step_s = args.step_ms / 1000
    print(f"judge: {where}; {args.calls} healthy steps, flushes of {args.rows} rows, median (min) of "
          f"{args.repeats} repeats, shares of a {args.step_ms:g} ms step")
    for key, label in (("lean", "every step, training thread: the loss against the judge's limit"),
                       ("judged", "a judged step, training thread: at_step with a loss and a norm"),
                       ("learn", "per row, flusher thread: learning from a flush")):
        median, low = costs[key]
        print(f"  {label}: {median * 1e6:.2f} us ({low * 1e6:.2f}), {100 * median / step_s:.3f}% of the step")
    per_step = costs["lean"][0] + costs["learn"][0]
    print(f"per step of a lean run (compare + learning): {per_step * 1e6:.2f} us, {100 * per_step / step_s:.3f}% of "
          f"a {args.step_ms:g} ms step; a sampled step adds {costs['judged'][0] * 1e6:.2f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
