"""The doctor's rule texts and its detectors that need no gradient hooks.

- ``RULES``: every rule id with why it matters and the fix, in one place;
- source lines: the user's ``file:line`` behind a call, skipping torch, ptdash and stdlib;
- flush-time detectors over host rows: ``LrZero``, ``Plateau``, ``InputBound``;
- ``DataWatch``: DataLoader, DistributedSampler and DataParallel, seen through patches that
  run once per loader, epoch or wrapper, never per step;
- ``SyncSampler``: CUDA syncs counted on two sampled steps;
- crash parsing for in-place autograd errors.
"""

from __future__ import annotations

import linecache
import math
import os
import re
import statistics
import sys
import sysconfig
import threading
import weakref
from collections import Counter
from typing import NamedTuple

import torch


class Rule(NamedTuple):
    """One entry of the doctor's catalogue."""

    severity: str
    """``error`` (the run is wrong), ``warning`` (slow or fragile) or ``info`` (worth a look)."""
    why: str
    """Why the finding matters."""
    fix: str
    """What to do about it."""


RULES: dict[str, Rule] = {
    "grads-never-cleared": Rule("error",
        "backward() adds to .grad instead of replacing it, so each update uses the sum of all gradients "
        "since the start: the steps grow every iteration and training diverges or stalls",
        "call optimizer.zero_grad() once per optimizer step, before backward() or right after step(); for "
        "gradient accumulation, zero once every N micro-batches, right after step()"),
    "zero-grad-before-step": Rule("error",
        "the gradients of this step are thrown away before the update, so the optimizer changes nothing (or "
        "only applies weight decay and momentum) and the model does not learn",
        "clear gradients before backward(), never between backward() and step(): zero_grad() -> forward -> "
        "backward() -> step() (or backward() -> step() -> zero_grad())"),
    "train-in-eval-mode": Rule("error",
        "in eval mode Dropout does nothing and BatchNorm normalises with its running statistics instead of "
        "the batch's and stops updating them: training loses its regularisation and BatchNorm never adapts",
        "call model.train() before the training loop and again after every evaluation (model.eval() and "
        "torch.no_grad() to evaluate, then model.train())"),
    "never-learns": Rule("error",
        "they take no part in computing the loss (a layer defined but never called, a branch never taken, an "
        "output that is .detach()ed), so they never change; under DistributedDataParallel they raise "
        "'Expected to have finished reduction in the prior iteration' unless find_unused_parameters=True",
        "remove the unused layers or use them in forward(); if they are used only on some steps under DDP, "
        "pass find_unused_parameters=True"),
    "never-learns/frozen": Rule("info",
        "frozen parameters never get a gradient, so the optimizer never updates them: if they were meant to "
        "train, they stay at their initial values; if they were meant to be frozen, the optimizer holds "
        "them for nothing",
        "to train them, set requires_grad=True before training; to freeze them, build the optimizer from "
        "[p for p in model.parameters() if p.requires_grad] (ignore this if you unfreeze them later on purpose)"),
    "inplace-autograd": Rule("error",
        "autograd keeps some forward tensors to compute gradients; an in-place op (x += y, x.relu_(), "
        "x[i] = v, x.mul_(), an inplace=True activation) overwrote one of them before backward() used it",
        "use the out-of-place form on that tensor (x = x + y, F.relu(x), inplace=False) or .clone() it before "
        "modifying it"),
    "host-syncs": Rule("warning",
        "each sync makes the CPU wait until the GPU has finished all queued work, so the CPU cannot queue the "
        "next kernels ahead and the GPU idles between steps",
        "keep values on the GPU and call .item()/.cpu() only on logging steps; do not print tensors or branch "
        "on their values every step; copy batches with pin_memory=True and .to(device, non_blocking=True)"),
    "sampler-no-set-epoch": Rule("warning",
        "the sampler seeds its shuffle with seed + epoch, so without set_epoch() every epoch visits the data "
        "in exactly the same order on every rank",
        "call sampler.set_epoch(epoch) at the start of each epoch, before iterating the DataLoader"),
    "dataparallel": Rule("warning",
        "DataParallel is one process with a thread per GPU: it copies the model to every GPU on each forward, "
        "gathers outputs and gradients on GPU 0 (which runs out of memory first) and is bound by the GIL; "
        "DistributedDataParallel is faster even on one machine",
        "use DistributedDataParallel, one process per GPU: init_process_group, DDP(model, "
        "device_ids=[local_rank]), a DistributedSampler, and launch with torchrun --nproc-per-node N train.py"),
    "input-bound": Rule("warning",
        "the training loop itself loads and collates every batch while the model waits",
        "; if that is not enough, make __getitem__ cheaper (decode or preprocess once, cache)"),
    "lr-zero": Rule("error",
        "with a learning rate of 0 the update is zero, so those parameters do not learn; usually a scheduler "
        "whose factor is 0 (a warmup that never rises, a decay that already ended) or lr=0 in a param group",
        "check optimizer.param_groups[i]['lr'] after building the scheduler, and the scheduler's lambda or "
        "warmup length"),
    "loss-plateau": Rule("info",
        "the model has stopped learning: the learning rate may be too low (or so high that it oscillates) or "
        "decayed to ~0, the model may be too small, or the labels may not match the inputs",
        "try other learning rates (the dashboard's LR factor key 'l' changes it live), check the schedule and "
        "that labels match inputs; if it has converged, stop early and save the compute"),
}
"""Rule id (or ``id/case``) -> its severity, why it matters and the fix: the doctor's one catalogue."""

# ------------------------------------------------------------------------ source lines

_ENGINE_DIR = os.path.dirname(os.path.abspath(__file__))
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_STDLIB_DIR = os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep


def is_internal(filename: str) -> bool:
    """Frames of torch, ptdash's engine or the standard library: never the user's line."""
    if filename.startswith("<frozen") or filename.startswith(_TORCH_DIR):
        return True
    if os.path.dirname(filename) == _ENGINE_DIR:  # engine/demo is user code
        return True
    return filename.startswith(_STDLIB_DIR) and "-packages" not in filename


def user_frame(frame):
    """The innermost frame at or above ``frame`` that belongs to the user's code."""
    while frame is not None and is_internal(os.path.abspath(frame.f_code.co_filename)):
        frame = frame.f_back
    return frame


def short_path(filename: str) -> str:
    """A path relative to the working directory when it is inside it."""
    try:
        rel = os.path.relpath(filename)
    except ValueError:
        return filename
    return filename if rel.startswith("..") else rel


def where(frame) -> str | None:
    """``train.py:42`` for a frame (None for no frame)."""
    return None if frame is None else f"{short_path(frame.f_code.co_filename)}:{frame.f_lineno}"


def caller() -> str | None:
    """The user's source line that led to the current call (a few microseconds)."""
    return where(user_frame(sys._getframe(1)))


def line_text(source: str | None) -> str:
    """The stripped text of a ``path:line`` source, or ''."""
    path, _, line = (source or "").rpartition(":")
    try:
        return linecache.getline(path, int(line)).strip() if path else ""
    except (ValueError, OSError):
        return ""


def quoted(source: str | None) -> str:
    """``train.py:42 (`loss.item()`)``: a source with its line of code."""
    text = line_text(source)
    return f"{source} (`{text}`)" if text else (source or "an unknown line")


def name_list(names: list[str], limit: int = 5) -> str:
    """``a, b, c and 4 more``."""
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


# ---------------------------------------------------------------------- flush-time rules


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
                if name.startswith("opt/lr/group"):
                    if value == 0.0:
                        run = self._run.setdefault(name, [step, step])
                        run[1] = step
                        if run[1] - run[0] + 1 >= self.steps:
                            found[name.removeprefix("opt/lr/group")] = tuple(run)
                    else:
                        self._run.pop(name, None)
        return found or None


class Plateau:
    """The loss has not improved for ``max(min_steps, fraction * step)`` steps.

    Robust against noise: the loss is judged by the median of each block of ``block``
    steps, and a block improves on the best only if it beats it by ``rel_tol`` of its size.
    """

    def __init__(self, block: int = 50, min_steps: int = 500, fraction: float = 0.3, rel_tol: float = 0.01) -> None:
        self.block, self.min_steps, self.fraction, self.rel_tol = block, min_steps, fraction, rel_tol
        self._values: list[float] = []
        self._block_start: int | None = None
        self.best: float | None = None
        self.best_steps: tuple[int, int] | None = None
        self.last: float | None = None

    def add(self, rows: list) -> dict | None:
        """Feed a flush's rows; what was seen once the loss has plateaued."""
        for step, _wall, values in rows:
            loss = values.get("loss")
            if loss is None or not math.isfinite(loss):
                continue
            if self._block_start is None:
                self._block_start = step
            self._values.append(loss)
            if len(self._values) >= self.block:
                self.last = statistics.median(self._values)
                if self.best is None or self.last < self.best - self.rel_tol * abs(self.best):
                    self.best, self.best_steps = self.last, (self._block_start, step)
                self._values, self._block_start = [], None
            if self.best_steps is not None:
                stale = step - self.best_steps[1]
                if stale >= max(self.min_steps, self.fraction * step):
                    return {"best": self.best, "best_steps": list(self.best_steps), "now": self.last,
                            "step": step, "stale_steps": stale}
        return None


class InputBound:
    """The median share of step time spent waiting for data, after a warmup."""

    def __init__(self, threshold: float = 0.5, warmup_steps: int = 5, min_steps: int = 20) -> None:
        self.threshold, self.warmup_steps, self.min_steps = threshold, warmup_steps, min_steps
        self._shares: list[float] = []

    def add(self, rows: list) -> tuple[float, int] | None:
        """Feed a flush's rows; ``(median share, steps)`` once input-bound."""
        for step, _wall, values in rows:
            data, total = values.get("time/data_s"), values.get("time/step_s")
            if step > self.warmup_steps and data is not None and total:
                self._shares.append(data / total)
        self._shares = self._shares[-200:]
        if len(self._shares) < self.min_steps:
            return None
        share = statistics.median(self._shares)
        return (share, len(self._shares)) if share > self.threshold else None


# --------------------------------------------------------------------------- data watch


class DataWatch:
    """DataLoaders, DistributedSamplers and DataParallel, seen through patches.

    ``report(rule, what, **data)`` raises a finding; the patches cost a few microseconds
    per loader, epoch or wrapper, nothing per step.
    """

    def __init__(self, report, step) -> None:
        self._report, self._step = report, step
        self._sources: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._epochs: dict[int, tuple[weakref.ref, int | None]] = {}
        self.loader: tuple[int, bool, str | None] | None = None
        """``(num_workers, pin_memory, source)`` of the DataLoader the loop iterates now."""

    def patches(self) -> list[tuple]:
        """``(owner, name, when, callback)``: call ``callback(obj)`` before/after ``owner.name``."""
        from torch.utils.data import DataLoader, DistributedSampler

        return [(DataLoader, "__init__", "after", self._on_loader),
                (DataLoader, "__iter__", "before", self._on_loader_iter),
                (DistributedSampler, "__iter__", "before", self._on_sampler_iter),
                (torch.nn.DataParallel, "__init__", "after", self._on_dataparallel)]

    def _on_loader(self, loader) -> None:
        self._sources[loader] = caller()

    def _on_loader_iter(self, loader) -> None:
        # Plain values: a loader made in the `for` statement itself is gone by the flush.
        self.loader = (int(loader.num_workers), bool(loader.pin_memory), self._sources.get(loader))

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

    def input_bound(self, share: float, steps: int, cuda: bool) -> None:
        """The loop waits for data: a finding if the DataLoader's settings are the likely cause."""
        if self.loader is None:
            return
        workers, pinned, source = self.loader
        if workers >= 2 and (pinned or not cuda):
            return  # the generic monitor hint covers a loader that is already parallel
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
                     + f" has num_workers={workers}, pin_memory={pinned}",
                     why=why, fix=fix, source=source, data_share=share, num_workers=workers, pin_memory=pinned)


def _cpus() -> int | None:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


# ------------------------------------------------------------------------- host syncs

SYNC_TEXT = "synchronizing CUDA operation"
_READ_BACK = (".item(", ".cpu(", ".tolist(", ".numpy(", "print(", "float(", "int(", "bool(", "cpu")


def sync_kind(text: str) -> str:
    """``copy-in`` for a line that looks like a batch copy to the GPU, else ``read-back``.

    A blocking host-to-device copy also waits for the GPU, but moving the batch once a
    step is the norm; the rule is about reading values back (.item(), printing tensors).
    """
    if any(k in text for k in _READ_BACK):
        return "read-back"
    return "copy-in" if (".to(" in text or ".cuda(" in text) else "read-back"


class SyncSampler:
    """Counts the training thread's CUDA syncs per source line on pairs of sampled steps.

    ``torch.cuda.set_sync_debug_mode("warn")`` makes every synchronizing call warn; for
    the two sampled steps those warnings are counted (and kept from the user's stderr),
    then the mode goes back to off. Lines that synced in both steps sync every step. A
    script that sets the mode itself is left alone.
    """

    def __init__(self, first: int = 20, set_mode=None, get_mode=None) -> None:
        self.next_start = first
        self._set_mode = set_mode or torch.cuda.set_sync_debug_mode
        self._get_mode = get_mode or torch.cuda.get_sync_debug_mode
        self.counter: Counter | None = None
        self.windows: list[tuple[int, Counter]] = []
        self.thread: int | None = None
        self._filter = None

    @property
    def active(self) -> bool:
        return self.counter is not None

    def on_post_step(self, step: int) -> dict | None:
        """After step ``step`` (training thread): open or close a window; a finished pair's result."""
        if self.counter is None:
            if step + 1 == self.next_start:
                self._start()
            return None
        self.windows.append((step, self.counter))
        if len(self.windows) < 2:
            self.counter = Counter()
            return None
        self.stop()
        result = self._analyse()
        self.windows = []
        self.next_start *= 10
        return result

    def on_warning(self, message, frame) -> bool:
        """A warning is being shown; True if it is a sampled sync (count it, hide it)."""
        if self.counter is None or SYNC_TEXT not in str(message):
            return False
        if threading.get_ident() == self.thread:
            self.counter[where(user_frame(frame)) or "?"] += 1
        return True

    def _start(self) -> None:
        import warnings

        if self._get_mode() != 0:
            self.next_start = -1  # the script checks its own syncs
            return
        self.thread = threading.get_ident()
        warnings.filterwarnings("always", message=".*" + SYNC_TEXT)
        self._filter = warnings.filters[0]
        self.counter = Counter()
        self._quietly_set("warn")

    def stop(self) -> None:
        """End sampling now: sync debug mode off, our warning filter gone."""
        if self.counter is not None:
            self.counter = None
            self._quietly_set(0)
            remove_filter(self._filter)
            self._filter = None

    def _quietly_set(self, mode) -> None:
        import warnings

        # torch warns that the mode is a prototype: ptdash's doing, not the script's.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Synchronization debug mode")
            self._set_mode(mode)

    def _analyse(self) -> dict | None:
        (a, first), (b, second) = self.windows
        lines = [{"source": s, "text": line_text(s), "per_step": min(first[s], second[s])}
                 for s in first.keys() & second.keys()]
        for line in lines:
            line["kind"] = sync_kind(line["text"])
        lines.sort(key=lambda x: (x["kind"] != "read-back", -x["per_step"], x["source"]))
        read_back = sum(x["per_step"] for x in lines if x["kind"] == "read-back")
        return {"steps": [a, b], "per_step": read_back, "lines": lines} if read_back else None


def remove_filter(entry) -> None:
    """Take one entry out of the warning filters (one this module put there)."""
    import warnings

    if entry is not None and entry in warnings.filters:
        warnings.filters.remove(entry)
        mutated = getattr(warnings, "_filters_mutated", None)
        if mutated is not None:
            mutated()


# ------------------------------------------------------------------------ crash parsing

_INPLACE = re.compile(r"modified by an inplace operation: \[(?P<tensor>.+?)\], which is output (?P<output>\d+) "
                      r"of (?P<node>\w+), is at version (?P<version>\d+); expected version (?P<expected>\d+)")
_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')
UNUSED_PARAMS_ERROR = "Expected to have finished reduction in the prior iteration"
"""DistributedDataParallel's error when some parameters got no gradient."""


def parse_inplace(text: str) -> dict | None:
    """The parts of autograd's 'modified by an inplace operation' error, or None."""
    if "modified by an inplace operation" not in text:
        return None
    m = _INPLACE.search(text)
    return m.groupdict() if m else {}


def anomaly_source(trace: str) -> str | None:
    """The innermost user frame of the forward traceback that anomaly mode prints."""
    found = None
    for m in _FRAME.finditer(trace):
        if not is_internal(os.path.abspath(m["file"])):
            found = f"{short_path(os.path.abspath(m['file']))}:{m['line']}"
    return found


def crash_source(exc: BaseException) -> str | None:
    """The innermost user frame of an exception's traceback."""
    tb, found = exc.__traceback__, None
    while tb is not None:
        if not is_internal(os.path.abspath(tb.tb_frame.f_code.co_filename)):
            found = f"{short_path(tb.tb_frame.f_code.co_filename)}:{tb.tb_lineno}"
        tb = tb.tb_next
    return found
