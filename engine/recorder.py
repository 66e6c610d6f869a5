"""Per-step records, kept on the device by the training thread and moved to the host in
batches by the flusher thread.

The training thread only fills a slotted record with what it already holds (tensor
references, floats, timestamps) and appends it (a deque append is atomic under the GIL):
recording a step costs no lock, no host sync and no dictionary. Everything derived (the
loss over micro-batches, the time split, the named values) is built by the flusher, which
drains everything recorded since the previous flush and converts it with one copy per
device and dtype. On CUDA that copy goes to pinned memory without blocking, and the
flusher polls an event until it lands, so not even the flusher synchronises the stream.
"""

from __future__ import annotations

import collections
import math
import time
from dataclasses import dataclass

import torch

from .protocol import finite_or_none


class StepRecord:
    """What one optimizer step left behind, as the training thread saw it.

    Tensors are 0-d device tensors (``losses``, ``total``, a learning rate) or 1-d
    per-parameter ones (``layers``, ``update_ratios``); they become floats at the flush.
    """

    __slots__ = ("step", "wall", "losses", "total", "layers", "params", "clip_max", "lrs", "times",
                 "samples", "update_ratios", "user")

    def __init__(self, step: int, wall: float, losses=(), total=None, layers=None, params=None,
                 clip_max: float | None = None, lrs=(), times=None, samples: int = 0,
                 update_ratios=None, user: dict | None = None) -> None:
        self.step, self.wall = step, wall
        self.losses = losses
        """The step's loss tensors: one per micro-batch, added up (left to right) at the flush."""
        self.total, self.layers, self.params = total, layers, params
        """Total gradient norm, per-parameter norms, and the parameters they describe."""
        self.clip_max = clip_max
        self.lrs = lrs
        """Each param group's effective learning rate (a float or a 0-d tensor)."""
        self.times = times
        """``(previous step's end, first forward, optimizer start, this step's end)``, perf_counter
        seconds; the forward and optimizer ones may be None."""
        self.samples = samples
        self.update_ratios = update_ratios
        self.user = user
        """Values logged with ``ptdash.log`` since the previous step."""


@dataclass
class LayerRow:
    """Per-parameter values of one step, on the host."""

    step: int
    params: list
    grad_norms: list
    update_ratios: list | None


class Recorder:
    """The hand-off between the training thread and the flusher."""

    def __init__(self) -> None:
        self._pending: collections.deque[StepRecord] = collections.deque()

    def add(self, record: StepRecord) -> None:
        """Called on the training thread: never blocks, never syncs."""
        self._pending.append(record)

    def __len__(self) -> int:
        return len(self._pending)

    def drain(self, wanted: set | frozenset = frozenset()) -> tuple[list[list], list[LayerRow]]:
        """Take every pending record; return Metrics rows and per-layer rows.

        Called on the flusher thread. Rows are ``[step, wall, {name: value}]`` with
        non-finite values as None. Per-layer rows are converted for the steps that use
        them: the newest, those with update ratios or a non-finite loss or norm, and the
        steps in ``wanted``; the norms of the others were computed (the total needs them)
        but are dropped unread.
        """
        records = []
        pending = self._pending
        while pending:
            records.append(pending.popleft())
        if not records:
            return [], []
        # Each record's device scalars, in a fixed order: [loss], [total], then tensor LRs and user values.
        scalars: list[torch.Tensor] = []
        for r in records:
            if r.losses:
                scalars.append(_fold(r.losses))
            if r.total is not None:
                scalars.append(r.total)
            scalars.extend(v for v in r.lrs if isinstance(v, torch.Tensor))
            if r.user:
                scalars.extend(v for v in r.user.values() if isinstance(v, torch.Tensor))
        host = iter(_to_host(scalars))
        rows, keep = [], []
        for r in records:
            values: dict[str, float | None] = {}
            finite = True
            if r.losses:
                values["loss"] = loss = finite_or_none(next(host))
                values["loss/micro_batches"] = float(len(r.losses))
                finite = loss is not None
            if r.total is not None:
                values["grad/norm_total"] = total = finite_or_none(next(host))
                finite = finite and total is not None
                if r.clip_max is not None:
                    values["grad/clip_max"] = r.clip_max
                    values["grad/clipped"] = None if total is None else float(total > r.clip_max)
            for i, lr in enumerate(r.lrs):
                values[f"opt/lr/group{i}"] = finite_or_none(next(host) if isinstance(lr, torch.Tensor) else float(lr))
            if r.times is not None:
                before, forward, optim, end = r.times
                values["time/step_s"] = end - before
                if forward is not None and optim is not None:
                    values["time/data_s"] = max(0.0, forward - before)
                    values["time/compute_s"] = max(0.0, optim - forward)
                    values["time/optim_s"] = end - optim
                if r.samples:
                    values["throughput/samples_per_s"] = r.samples / max(end - before, 1e-9)
            if r.user:
                for name, value in r.user.items():
                    values[name] = finite_or_none(next(host) if isinstance(value, torch.Tensor) else float(value))
            rows.append([r.step, r.wall, values])
            if r.layers is not None and (not finite or r.update_ratios is not None or r.step in wanted):
                keep.append(r)
        if records[-1].layers is not None and (not keep or keep[-1] is not records[-1]):
            keep.append(records[-1])
        return rows, _layer_rows(keep)


def _fold(losses: list[torch.Tensor]) -> torch.Tensor:
    """The micro-batch losses added up left to right, as a script summing them would."""
    total = losses[0]
    for loss in losses[1:]:
        total = total + loss
    return total


def _layer_rows(records: list[StepRecord]) -> list[LayerRow]:
    norms = _to_host([r.layers for r in records], flat=False)
    ratios = iter(_to_host([r.update_ratios for r in records if r.update_ratios is not None], flat=False))
    out = []
    for r, values in zip(records, norms):
        row_ratios = None
        if r.update_ratios is not None:
            row_ratios = [v if math.isfinite(v) else None for v in next(ratios)]
        out.append(LayerRow(r.step, r.params or [], [v if math.isfinite(v) else None for v in values], row_ratios))
    return out


def _to_host(tensors: list[torch.Tensor], flat: bool = True) -> list:
    """Copy tensors to the host, one copy per device, preserving order.

    ``flat``: the tensors are 0-d and the result is a list of floats; otherwise each is
    1-d and the result is a list of float lists.
    """
    if not tensors:
        return []
    out: list = [None] * len(tensors)
    by_device: dict[torch.device, list[int]] = collections.defaultdict(list)
    for index, t in enumerate(tensors):
        by_device[t.device].append(index)
    for device, indices in by_device.items():
        if flat:
            parts = [tensors[i] for i in indices]
            try:  # the common case: all 0-d, one dtype
                stacked = torch.stack(parts)
            except RuntimeError:
                stacked = torch.stack([p.detach().float().reshape(()) for p in parts])
            host = _copy_without_sync(stacked.detach().float().reshape(-1)).tolist()
            for i, value in zip(indices, host):
                out[i] = value
            continue
        parts = [tensors[i].detach().float().reshape(-1) for i in indices]
        host = _copy_without_sync(torch.cat(parts)).tolist()
        offset = 0
        for i, part in zip(indices, parts):
            size = part.numel()
            out[i] = host[offset:offset + size]
            offset += size
    return out


def _copy_without_sync(t: torch.Tensor, poll: float = 0.001) -> torch.Tensor:
    if t.device.type != "cuda":
        return t.cpu()
    # A non_blocking copy into pinned memory plus an event query never synchronises the
    # stream: the flusher sleeps until the copy has landed instead of blocking on it.
    with torch.cuda.device(t.device):
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        host.copy_(t, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
    while not event.query():
        time.sleep(poll)
    return host
