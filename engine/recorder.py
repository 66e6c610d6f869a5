"""Per-step records, kept on the device by the training thread and moved to the host in
batches by the flusher thread.

The training thread only appends (a deque append is atomic under the GIL), so recording
a step costs no lock and no host sync. The flusher drains everything recorded since the
previous flush and converts it with one copy per device. On CUDA that copy goes to pinned
memory without blocking, and the flusher polls an event until it lands, so not even the
flusher thread synchronises the stream.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field

import torch

from .protocol import finite_or_none


@dataclass
class StepRecord:
    """What one optimizer step left behind.

    ``host`` values are plain floats already; ``device`` values are 0-d tensors that
    become floats at the flush; ``layers`` is an optional 1-d tensor of per-parameter
    gradient norms.
    """

    step: int
    wall: float
    host: dict[str, float] = field(default_factory=dict)
    device: dict[str, torch.Tensor] = field(default_factory=dict)
    layers: torch.Tensor | None = None
    params: list | None = None
    """The parameters ``layers`` describes, in order (a reference, not a copy)."""
    update_ratios: torch.Tensor | None = None
    """Per-parameter |w_after - w_before| / |w_before| on the steps that sample it."""


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

    def drain(self) -> tuple[list[list], list[LayerRow]]:
        """Take every pending record; return Metrics rows and per-layer rows.

        Called on the flusher thread. Rows are ``[step, wall, {name: value}]`` with
        non-finite values as None.
        """
        records = []
        while self._pending:
            records.append(self._pending.popleft())
        if not records:
            return [], []
        device_values = _to_host([v for r in records for v in r.device.values()])
        layer_values = _to_host([r.layers for r in records if r.layers is not None], flat=False)
        ratio_values = _to_host([r.update_ratios for r in records if r.update_ratios is not None], flat=False)
        rows, layers, i, j, k = [], [], 0, 0, 0
        for r in records:
            values = {k: finite_or_none(v) for k, v in r.host.items()}
            for name in r.device:
                values[name] = finite_or_none(device_values[i])
                i += 1
            rows.append([r.step, r.wall, values])
            if r.layers is not None:
                ratios = None
                if r.update_ratios is not None:
                    ratios = [finite_or_none(v) for v in ratio_values[k]]
                    k += 1
                layers.append(LayerRow(r.step, r.params or [], [finite_or_none(v) for v in layer_values[j]], ratios))
                j += 1
        return rows, layers


def _to_host(tensors: list[torch.Tensor], flat: bool = True) -> list:
    """Copy tensors to the host, batched per device, preserving order.

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
        parts = [tensors[i].detach().float().reshape(-1) for i in indices]
        sizes = [p.numel() for p in parts]
        host = _copy_without_sync(torch.cat(parts)).tolist()
        offset = 0
        for i, size in zip(indices, sizes):
            chunk = host[offset:offset + size]
            out[i] = chunk[0] if flat else chunk
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
