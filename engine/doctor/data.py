"""The input side: DataLoaders, DistributedSamplers, DataParallel, and input-bound loops.

``DataWatch`` sees loaders, samplers and wrappers through patches that run once per
loader, epoch or wrapper, never per step. ``InputBound`` is the one detector of a loop
that waits for its data.
"""

from __future__ import annotations

import os
import statistics
import weakref
from typing import Callable

import torch

from ..shared.names import DATA_S, STEP_S
from .rules import RULES
from .sources import caller, quoted


class InputBound:
    """The median share of step time spent waiting for data, after a warmup; it fires once."""

    def __init__(self, threshold: float = 0.5, warmup_steps: int = 5, min_steps: int = 20) -> None:
        self.threshold, self.warmup_steps, self.min_steps = threshold, warmup_steps, min_steps
        self._shares: list[float] = []
        self.fired = False

    def add(self, rows: list) -> tuple[float, int] | None:
        """Feed a flush's rows; ``(median share, steps)`` once input-bound."""
        for step, _wall, values in rows:
            data, total = values.get(DATA_S), values.get(STEP_S)
            if step > self.warmup_steps and data is not None and total:
                self._shares.append(data / total)
        self._shares = self._shares[-200:]
        if self.fired or len(self._shares) < self.min_steps:
            return None
        share = statistics.median(self._shares)
        if share <= self.threshold:
            return None
        self.fired = True
        return share, len(self._shares)


class DataWatch:
    """DistributedSamplers and DataParallel, seen through patches; the input-bound finding.

    ``report(rule, what, **data)`` raises a finding; ``loader()`` describes the training
    DataLoader (``loaders.Loaders.describe``). The patches cost a few microseconds per
    epoch or wrapper, nothing per step.
    """

    def __init__(self, report, step, loader=lambda: None) -> None:
        self._report, self._step, self._loader = report, step, loader
        self._epochs: dict[int, tuple[weakref.ref, int | None]] = {}

    def patches(self) -> list[tuple]:
        """``(owner, name, when, callback)``: call ``callback(obj)`` before/after ``owner.name``."""
        from torch.utils.data import DistributedSampler

        return [(DistributedSampler, "__iter__", "before", self._on_sampler_iter),
                (torch.nn.DataParallel, "__init__", "after", self._on_dataparallel)]

    def _on_sampler_iter(self, sampler) -> None:
        if not getattr(sampler, "shuffle", False):
            return
        epoch = getattr(sampler, "epoch", None)
        previous = self._epochs.get(id(sampler))
        self._epochs[id(sampler)] = (weakref.ref(sampler), epoch)
        if previous is not None and previous[0]() is sampler and previous[1] == epoch:
            source = caller()
            self._report("sampler-no-set-epoch",
                         f"a DistributedSampler (shuffle=True) was iterated again with the same epoch number "
                         f"({epoch}) at {quoted(source)}: set_epoch() is never called",
                         step=self._step(), source=source, epoch=epoch)

    def _on_dataparallel(self, dp) -> None:
        source = caller()
        n = len(getattr(dp, "device_ids", None) or [])
        inner = type(getattr(dp, "module", dp)).__name__
        why = RULES["dataparallel"].why + ("; with fewer than two GPUs it only adds a wrapper" if n < 2 else "")
        gpus = "no GPU" if n == 0 else f"{n} GPU" + ("s" if n > 1 else "")
        self._report("dataparallel", f"nn.DataParallel wraps {inner} at {quoted(source)} ({gpus})",
                     why=why, source=source, module=inner, devices=n)

    def input_bound(self, share: float, steps: int, cuda: bool, hint: Callable[[str, float], None]) -> None:
        """The loop waits for data: a hint (the System tab's line), and a finding when the
        DataLoader's settings are the likely cause."""
        hint(f"input-bound: {share:.0%} of each step is spent waiting for data; try more DataLoader "
             "workers (num_workers) and pin_memory=True", share)
        loader = self._loader()
        if loader is None or (loader[0] >= 2 and (loader[1] or not cuda)):
            return  # already parallel (and pinned), or no DataLoader seen: the hint says all there is
        workers, pinned, source = loader
        changes = [f"num_workers={min(8, max(2, (_cpus() or 2) - 1))}", "persistent_workers=True"] if workers < 2 else []
        why = RULES["input-bound"].why if workers == 0 else f"{workers} worker cannot keep up with the model"
        if cuda and not pinned:
            changes.append("pin_memory=True")
            why += "; without pinned memory, copies to the GPU cannot overlap compute"
        fix = (f"DataLoader(..., {', '.join(changes)})" + (" and .to(device, non_blocking=True)" if cuda and not pinned
                                                           else "") + RULES["input-bound"].fix)
        self._report("input-bound",
                     f"{share:.0%} of each step waits for data (median of {steps} steps) and the DataLoader"
                     + (f" made at {quoted(source)}" if source else "")
                     + f" has num_workers={workers}, pin_memory={pinned}; the wait is the time inside its __next__",
                     why=why, fix=fix, source=source, data_share=share, num_workers=workers, pin_memory=pinned)


def _cpus() -> int | None:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
