"""The least a per-step gradient statistic can cost on the MLP, without ptdash.

    python benchmarks/guard_floor.py [--cycles 400] [--steps 4]

Bare optimizer hooks on the ``overhead.py`` MLP, each doing only the minimum, taking
turns in short runs timed by the training thread's CPU clock (as ``overhead.py``'s paired
runs are), against the plain loop:

- ``norm``: the loop computes ``torch._foreach_norm`` over the gradients itself (the
  reference of the MLP target);
- ``norms``: a pre-step hook computes the same pass; a post-step hook appends a record;
- ``guard``: ``norms`` plus what catching a non-finite gradient before the update needs
  on CPU: the norms stacked into one tensor, the total norm, and reading it and the loss
  on the host (the loss kept by a ``backward`` wrapper).

``guard`` minus ``norm`` is the floor under ptdash's default hot path on this machine:
no bookkeeping, no timing, no commands, only the statistic and the check.
"""

from __future__ import annotations

import argparse
import collections
import math
import os
import statistics
import sys
import time
import warnings
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=400)
    parser.add_argument("--steps", type=int, default=4, help="timed steps per short run")
    args = parser.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = "1"
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    sys.path.insert(0, str(Path(__file__).parent))
    from overhead import make_mlp

    torch.set_num_threads(1)
    w = make_mlp(0)
    params = w.params
    records: collections.deque = collections.deque(maxlen=100)
    losses: list = []
    state: dict = {}
    backward = torch.autograd.backward

    def keep_loss(tensors, *a, **k):
        losses.append(tensors.detach())
        return backward(tensors, *a, **k)

    def norms(opt, args, kwargs):
        state["norms"] = torch._foreach_norm([p.grad for p in params])

    def guard(opt, args, kwargs):
        stacked = torch.stack(torch._foreach_norm([p.grad for p in params]))
        total = torch.linalg.vector_norm(stacked)
        if not (math.isfinite(total.item()) and math.isfinite(losses[-1].item())):
            raise FloatingPointError("non-finite gradient")
        state["norms"] = (stacked, total)

    def record(opt, args, kwargs):
        records.append((time.time(), list(losses), state.pop("norms")))
        losses.clear()

    hooks = {"norms": norms, "guard": guard}
    handles: list = []

    def switch(variant: str) -> None:
        for h in handles:
            h.remove()
        handles.clear()
        torch.autograd.backward = backward
        if variant in hooks:
            handles.extend([register_optimizer_step_pre_hook(hooks[variant]),
                            register_optimizer_step_post_hook(record)])
            torch.autograd.backward = keep_loss

    variants = ("plain", "norm", "norms", "guard")
    times: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(50):
        w.step("plain")
    for i in range(args.cycles):
        k = i % len(variants)
        for variant in variants[k:] + variants[:k]:
            switch(variant)
            loop = "norm" if variant == "norm" else "plain"
            w.step(loop)  # the switch's step, untimed
            t0 = time.thread_time()
            for _ in range(args.steps):
                w.step(loop)
            times[variant].append((time.thread_time() - t0) / args.steps)
    switch("plain")
    print(f"MLP, {args.cycles} cycles of {args.steps}-step runs, training-thread CPU per step; plain "
          f"{statistics.fmean(times['plain']) * 1e3:.2f} ms; load average {os.getloadavg()[0]:.2f}")
    for variant in variants[1:]:
        diffs = [(a - b) * 1e6 for a, b in zip(times[variant], times["plain"])]
        half = 2 * statistics.stdev(diffs) / math.sqrt(len(diffs))
        mean = statistics.fmean(diffs)
        print(f"  {variant:6s} {mean:+6.0f} µs/step [95% {mean - half:+.0f}, {mean + half:+.0f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
