"""Per-step records, kept on the device by the training thread and moved to the host in
batches by the flusher thread.

The training thread only builds a StepRecord (a named tuple) of what it already holds
(tensor references, floats, timestamps) and appends it (a deque append is atomic under
the GIL): recording a step costs no lock, no host sync and no dictionary. Everything derived (the
loss over micro-batches, the time split, the named values) is built by the flusher, which
drains everything recorded since the previous flush and converts it with one copy per
device and dtype. On CUDA that copy goes to pinned memory without blocking, and the
flusher polls an event until it lands, so not even the flusher synchronises the stream.
"""

from __future__ import annotations

import collections
import functools
import logging
import math
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from .metrics import fold
from .sharded import host_readable, is_dtensor
from .shared import names
from .shared.names import STEP_S
from .shared.numbers import finite_or_none

log = logging.getLogger("ptdash.recorder")
_isfinite = math.isfinite


class StepRecord(NamedTuple):
    """One step as the training thread recorded it: references it already held, no copies.

    A tuple with names: building it costs the hot path one small allocation and no host
    sync; the flusher derives everything else from it. The training thread builds it from
    a tuple of all its fields (no Python frame) and checks its length there
    (``RECORD_FIELDS``), so a builder and this class that disagree fail at the first step
    that builds one, not on the flusher.
    """

    step: int
    """The step number (from 1)."""
    wall: float
    """``time.time()`` at the step's end."""
    losses: list
    """The step's loss tensors, one per micro-batch, added up (left to right) at the flush;
    or the one loss's value as a float, when the training thread read it already (the
    CPU loss of a lean step, wrappers.py and prestep.py)."""
    total: Any
    """The total gradient norm (a 0-d tensor), or None."""
    layers: Any
    """The per-parameter gradient norms (a 1-d tensor), or None."""
    params: list | None
    """The parameters ``layers`` describes."""
    clip_max: float | None
    """The clipping norm in force, or None."""
    lrs: list
    """Each param group's effective learning rate (a float or a 0-d tensor)."""
    times: tuple | None
    """``(start, first training forward, optimizer start, end, batch waits, closure
    time)`` in perf_counter seconds (see ``step_times``); None for another optimizer's step."""
    samples: int
    """The batch sizes the model's forward saw, or 0."""
    update_ratios: Any
    """Per-parameter |w_after - w_before| / |w_before| on sampled steps, or None."""
    user: dict | None
    """Values by series name: those ``ptdash.log`` gave since the previous step, and the
    step's own that have no field (a sharded model's ``grad/norm_local``); or None."""
    opt: int = 0
    """Which optimizer stepped: 0 the main one, k the k-th other (its series are opt<k>/...)."""
    own: float = 0.0
    """ptdash's own time on the training thread since the previous main record (s)."""
    extra: float = 0.0
    """The part of ``own`` that sampling the step cost: norms, checks, ratios, doctor (s)."""


RECORD_FIELDS = len(StepRecord._fields)
"""The fields of a StepRecord: each builder checks the length of the tuple it built (stepend.py)."""


class RecordShapeError(TypeError):
    """A StepRecord built with the wrong number of fields, raised where it was built (the
    training thread), before the flusher could take it."""

    def __init__(self, record: tuple, fields: int = RECORD_FIELDS) -> None:
        super().__init__(f"a StepRecord was built with {len(record)} fields where it has {fields} "
                         f"({', '.join(StepRecord._fields)}): its builder and recorder.StepRecord disagree")


@dataclass
class LayerRow:
    """Per-parameter values of one step, on the host."""

    step: int
    params: list
    grad_norms: list
    update_ratios: list | None


class Recorder:
    """The hand-off between the training thread and the flusher."""

    def __init__(self, observe=None) -> None:
        self._observe = observe
        """Shown every drained record (budget.Budget.observe), on the flusher thread."""
        self.dropped: str | None = None
        """What the first flush that dropped unreadable records said, for the run's events."""
        self._pending: collections.deque[tuple] = collections.deque()
        self.add = self._pending.append
        """Called on the training thread with a StepRecord: a deque's own append, so it
        never blocks, never syncs and runs no Python."""

    def __len__(self) -> int:
        return len(self._pending)

    def drain(self, wanted: set | frozenset = frozenset()) -> tuple[list[list], list["LayerRow"]]:
        """Take every pending record; return Metrics rows and per-layer rows.

        Called on the flusher thread. Rows are ``[step, wall, {name: value}]`` with
        non-finite values as None (``loss/micro_batches`` only on a step whose loss added up
        more than one: one micro-batch is the rule, not worth a value a step). Per-layer
        rows are converted for the steps that use them: the newest that has them, those
        with update ratios or a non-finite loss or norm, and the steps in ``wanted``; the
        norms of the others were computed (the total needs them) but are dropped unread.
        A record that cannot be read (built wrong, or holding a value no row can take) is
        dropped alone, logged; the flush keeps the others.
        """
        records = []
        pending = self._pending
        while pending:
            records.append(pending.popleft())
        if not records:
            return [], []
        try:
            out = self._convert(records, wanted)
        except Exception:  # noqa: BLE001 - a record that cannot be read must not lose the others
            good = self._readable(records)
            if len(good) == len(records):
                raise  # no record is at fault on its own: the flush fails as a whole (flusher.py)
            records = good
            out = self._convert(records, wanted) if records else ([], [])
        if self._observe is not None:
            self._observe(records)
        return out

    def _readable(self, records: list) -> list:
        """The records that convert on their own, in order; the others are dropped, and said so
        once (a record built wrong, or holding a value no row can take)."""
        good, dropped = [], []
        for record in records:
            try:
                self._convert([record], frozenset())
            except Exception as exc:  # noqa: BLE001
                dropped.append(f"{type(exc).__name__}: {exc}".splitlines()[0][:200])
            else:
                good.append(record)
        if dropped:
            log.error("dropped %d of %d step records the flush could not read (%s); kept the others",
                      len(dropped), len(records), dropped[0])
            if self.dropped is None:  # said once in the run's events (flusher.py), every time in engine.log
                self.dropped = f"dropped {len(dropped)} step record(s) the flush could not read ({dropped[0]})"
        return good

    def _convert(self, records: list, wanted: set | frozenset) -> tuple[list[list], list["LayerRow"]]:
        # A record that holds only host numbers (a lean step's: a loss read already, one
        # float LR, the step's time and nothing else) is a row at once; the others wait for
        # their device scalars, copied in one batch, in a fixed order: [loss], [total], then
        # tensor LRs and user values.
        scalars: list[torch.Tensor] = []
        add, extend = scalars.append, scalars.extend
        rows: list = []
        general = False
        main = _names(0, 1)
        loss_name, lr_name = main.loss, main.lrs[0]
        for r in records:
            step, wall, losses, total, _, _, _, lrs, times, _, _, user, opt, _, _ = r
            if (total is None and user is None and not opt and times is not None and times[4] is None
                    and times[1] is None and len(losses) == 1 and len(lrs) == 1):
                loss, lr = losses[0], lrs[0]
                if type(loss) is float and type(lr) is float:
                    rows.append([step, wall, {loss_name: loss if _isfinite(loss) else None,
                                              lr_name: lr if _isfinite(lr) else None,
                                              STEP_S: times[3] - times[0]}])
                    continue
            general = True
            rows.append(r)
            if losses and (len(losses) > 1 or type(losses[0]) is not float):  # a float: read already
                add(losses[0] if len(losses) == 1 else fold(losses))
            if total is not None:
                add(total)
            if len(lrs) != 1 or type(lrs[0]) is not float:
                extend(v for v in lrs if isinstance(v, torch.Tensor))
            if user:
                extend(v for v in user.values() if isinstance(v, torch.Tensor))
        if not general:
            return rows, _layer_rows([])
        host = iter(_to_host(scalars))
        out, keep = [], []
        for record in rows:
            if type(record) is list:  # a row already
                out.append(record)
                continue
            step, wall, losses, total, layers, _, clip_max, lrs, times, samples, ratios, user, opt, _, _ = record
            series = _names(opt, len(lrs))
            values: dict[str, float | None] = {}
            finite = True
            if losses:
                loss = losses[0] if len(losses) == 1 and type(losses[0]) is float else next(host)
                values[series.loss] = loss = loss if _isfinite(loss) else None
                if len(losses) > 1:
                    values[series.micro_batches] = float(len(losses))
                finite = loss is not None
            if total is not None:
                norm = next(host)
                values[series.norm_total] = norm = norm if _isfinite(norm) else None
                finite = finite and norm is not None
                if clip_max is not None:
                    values[series.clip_max] = clip_max
                    values[series.clipped] = None if norm is None else float(norm > clip_max)
            for name, lr in zip(series.lrs, lrs):
                if type(lr) is not float:
                    lr = next(host) if isinstance(lr, torch.Tensor) else float(lr)
                values[name] = lr if _isfinite(lr) else None
            if times is not None:
                if times[4] is None and times[1] is None:  # nothing timed inside the step
                    values[STEP_S] = times[3] - times[0]
                else:
                    values.update(step_times(times, samples))
            if user:
                for name, value in user.items():
                    values[name] = finite_or_none(next(host) if isinstance(value, torch.Tensor) else float(value))
            if opt and out and out[-1][0] == step:
                out[-1][2].update(values)  # another optimizer's step of the same iteration
            else:
                out.append([step, wall, values])
            if layers is not None and (not finite or ratios is not None or step in wanted):
                keep.append(record)
        rows = out
        # The newest step with per-layer norms (under the cost budget, the newest sampled one).
        newest = next((r for r in reversed(records) if r.layers is not None), None)
        if newest is not None and (not keep or keep[-1] is not newest):
            keep.append(newest)
        return rows, _layer_rows(keep)


class _Names(NamedTuple):
    """The series names of one optimizer's values (the main one's plain, the k-th other's
    ``opt<k>/...``), built once per optimizer and param-group count, not per row."""

    loss: str
    micro_batches: str
    norm_total: str
    clip_max: str
    clipped: str
    lrs: tuple


@functools.lru_cache(maxsize=256)
def _names(opt: int, groups: int) -> _Names:
    named = functools.partial(names.of_optimizer, opt)
    return _Names(named(names.LOSS), named(names.MICRO_BATCHES), named(names.GRAD_NORM), named(names.CLIP_MAX),
                  named(names.CLIPPED), tuple(names.lr(opt, group) for group in range(groups)))


def step_times(times: tuple, samples: int) -> dict[str, float]:
    """A main step's time, and on sampled steps its split and samples/s.

    ``times`` is ``(start, first training forward, optimizer start, end, batch waits,
    time inside a closure)``. The split's parts come from the same step and add up to it:
    ``data`` (inside the training loader's ``__next__``), ``compute`` (forward and backward:
    from the first training forward, or inside the closure, to the optimizer), ``optim``
    (the update) and ``other`` (the rest: evaluation, logging, checkpoints, the loop).
    """
    start, forward, pre, end, waits, inner = times
    step_s = end - start
    out = {STEP_S: step_s}
    if waits is None:
        return out
    data_before = sum(t1 - t0 for t0, t1, _ in waits if forward is None or t1 <= forward)
    data = data_before + sum(t1 - t0 for t0, t1, _ in waits if forward is not None and t1 > forward)
    out[names.DATA_S] = data
    if pre is not None:
        optim = max(0.0, end - pre - inner)
        if forward is not None:
            compute = max(0.0, pre - forward - (data - data_before)) + inner
        elif inner:  # a closure: its forward and backward run inside the step
            compute = inner
        else:  # no training forward seen (the model is found after step 1): no honest split
            return out
        out[names.COMPUTE_S], out[names.OPTIM_S] = compute, optim
        out[names.OTHER_S] = max(0.0, step_s - data - compute - optim)
    elif forward is not None:  # an inferred step: no update boundary is seen
        out[names.COMPUTE_S] = compute = max(0.0, end - forward - (data - data_before))
        out[names.OTHER_S] = max(0.0, step_s - data - compute)
    counted = sum(s for _, _, s in waits) or samples
    if counted:
        out[names.SAMPLES_PER_S] = counted / max(step_s, 1e-9)
    return out


def _layer_rows(records: list[StepRecord]) -> list[LayerRow]:
    norms = _to_host([r.layers for r in records], flat=False)
    ratios = iter(_to_host([r.update_ratios for r in records if r.update_ratios is not None], flat=False))
    out = []
    for record, values in zip(records, norms):
        row_ratios = None
        if record.update_ratios is not None:
            row_ratios = [finite_or_none(v) for v in next(ratios)]
        out.append(LayerRow(record.step, record.params or [], [finite_or_none(v) for v in values], row_ratios))
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
    if any(map(is_dtensor, tensors)):  # no collective on the flusher: what is local, else NaN
        tensors = [host_readable(t) for t in tensors]
    for index, t in enumerate(tensors):
        by_device[t.device].append(index)
    for device, indices in by_device.items():
        if flat:
            parts = [tensors[i] for i in indices]
            try:  # the common case: all 0-d
                stacked = torch.stack(parts)
            except RuntimeError:  # a (1,)-shaped loss among them
                stacked = torch.stack([p.reshape(()) for p in parts])
            host = _copy_without_sync(stacked.detach().float()).tolist()
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
