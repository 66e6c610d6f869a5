"""The last good state in host memory: a copy of what a checkpoint holds, taken without a
host sync, and restored into the script's own objects.

A ``Snapshot`` holds the models' state dicts, the optimizers', schedulers' and GradScalers'
states and the RNG states (what checkpoint.py gathers), with every tensor copied into a
host buffer that the next snapshot of the same shapes reuses (no allocation per refresh).

- On CPU the copy is a plain ``copy_``: it waits for nothing.
- On CUDA the buffers are pinned and the copies are issued on a side stream that first
  waits for the training stream (so it copies the state after the step's update), as
  ``non_blocking`` device-to-host copies; ``done`` is recorded after them. The training
  thread never waits: ``ready()`` asks the event without blocking, and ``fence()`` makes
  the training stream (not the host) wait for the copies before the next update may write
  the tensors they read.

``restore`` writes the copies back in place: ``copy_`` into each model's live parameters
and buffers (the script's tensors keep their identity), ``load_state_dict`` for the
optimizers and schedulers, the scalers' scale and growth tracker copied into theirs, and
the RNG states set. A GradScaler's ``state_dict`` reads its scale with ``.item()`` (a
sync on CUDA), so its tensors are copied directly instead.
"""

from __future__ import annotations

import copy
import os

import torch

from .checkpoint_format import rng_state, set_rng_state
from .discovery import model_names, unwrap
from .sharded import is_sharded


def default_memory() -> int:
    """Host bytes the snapshots may take by default: a quarter of the machine's memory."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4
    except (ValueError, OSError, AttributeError):  # no sysconf here: 4 GiB
        return 4 << 30


def sharded_models(models) -> bool:
    """Whether a model's parameters are shards (FSDP2's DTensors, FSDP1's flat parameters):
    a snapshot copies whole tensors (and FSDP1's state_dict would gather them every refresh)."""
    return any(is_sharded(list(m.parameters())) for m in models)


class _Slot:
    """Where a tensor stood in a state's structure: the index of its host buffer."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


def _flatten(value, sources: list):
    """``value`` with every tensor replaced by a _Slot (the tensor appended to ``sources``),
    the rest deep-copied (a state's numbers and lists must not change with the live one)."""
    if isinstance(value, torch.Tensor):
        sources.append(value.detach())
        return _Slot(len(sources) - 1)
    if isinstance(value, dict):
        return {k: _flatten(v, sources) for k, v in value.items()}
    if isinstance(value, list):
        return [_flatten(v, sources) for v in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_flatten(v, sources) for v in value)
    return copy.deepcopy(value)


def _fill(value, tensors: list):
    """The structure ``_flatten`` made, with each _Slot replaced by ``tensors[slot]``."""
    if isinstance(value, _Slot):
        return tensors[value.index]
    if isinstance(value, dict):
        return {k: _fill(v, tensors) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, tensors) for v in value]
    if isinstance(value, tuple):
        return tuple(_fill(v, tensors) for v in value)
    return copy.deepcopy(value)


def _scaler_state(scaler) -> dict:
    """A GradScaler's state without ``state_dict()`` (which syncs): its tensors and numbers."""
    return {name: getattr(scaler, name, None) for name in
            ("_scale", "_growth_tracker", "_init_scale", "_growth_factor", "_backoff_factor",
             "_growth_interval", "_init_growth_tracker")}


class Snapshot:
    """One copy of the training state (see the module docstring); ``nbytes`` its host memory."""

    def __init__(self) -> None:
        self.step = -1
        self.buffers: list[torch.Tensor] = []
        self._signature: tuple = ()
        self.structure: dict = {}
        self.rng: dict = {}
        self.done = None
        """The CUDA event recorded after the copies (None: on CPU, complete when taken)."""
        self.nbytes = 0

    @staticmethod
    def gather(models, optimizers, schedulers, scalers) -> tuple[dict, list[torch.Tensor]]:
        """The state's structure and the live tensors it refers to, in order."""
        sources: list[torch.Tensor] = []
        structure = {
            "models": {n: _flatten(unwrap(m).state_dict(), sources) for n, m in zip(model_names(models), models)},
            "optimizers": [_flatten(o.state_dict(), sources) for o in optimizers],
            "schedulers": [_flatten(s.state_dict(), sources) for s in schedulers],
            "scalers": [_flatten(_scaler_state(s), sources) for s in scalers],
        }
        return structure, sources

    @staticmethod
    def needed(sources: list[torch.Tensor]) -> int:
        """Host bytes a snapshot of these tensors takes."""
        return sum(t.numel() * t.element_size() for t in sources)

    def take(self, step: int, structure: dict, sources: list[torch.Tensor], stream=None,
             side: list[bool] | None = None) -> None:
        """Copy ``sources`` into this snapshot's buffers (allocated on the first take, or
        when the shapes changed). ``stream``: the CUDA side stream, when any source is on a
        GPU; ``side`` says which sources it copies (the others go on the training stream)."""
        signature = tuple((tuple(t.shape), t.dtype, t.device) for t in sources)
        if signature != self._signature:
            self.buffers = [torch.empty(t.shape, dtype=t.dtype, device="cpu",
                                        pin_memory=t.device.type == "cuda") for t in sources]
            self._signature = signature
            self.nbytes = self.needed(sources)
        self.step, self.structure = step, structure
        self.rng = rng_state()
        if stream is None:
            with torch.no_grad():
                for buf, src in zip(self.buffers, sources):
                    buf.copy_(src)
            self.done = None
            return
        self._take_cuda(sources, stream, side if side is not None else [True] * len(sources))

    def _take_cuda(self, sources: list[torch.Tensor], stream, side: list[bool]) -> None:
        """The CUDA path: device-to-host copies into pinned buffers, ``non_blocking``, after
        the training stream's work so far (the step's update): on ``stream`` for the sources
        ``side`` marks, on the training stream for the others. The host waits for none."""
        current = torch.cuda.current_stream()
        stream.wait_stream(current)
        with torch.no_grad():
            for buf, src, on_side in zip(self.buffers, sources, side):
                if src.device.type != "cuda":
                    buf.copy_(src)  # a CPU tensor (a step count): nothing to wait for
                elif not on_side:
                    buf.copy_(src, non_blocking=True)
            with torch.cuda.stream(stream):
                for buf, src, on_side in zip(self.buffers, sources, side):
                    if on_side and src.device.type == "cuda":
                        buf.copy_(src, non_blocking=True)
                        src.record_stream(stream)  # a tensor freed meanwhile is not reused under the copy
        stream.wait_stream(current)  # so that ``done`` covers the training stream's copies too
        self.done = torch.cuda.Event()
        self.done.record(stream)

    def ready(self) -> bool:
        """Whether the copies have landed (asks the CUDA event; never waits)."""
        return self.done is None or self.done.query()

    def fence(self) -> None:
        """Make the training stream wait for the copies (on the device; the host goes on)."""
        if self.done is not None:
            torch.cuda.current_stream().wait_event(self.done)

    def restore(self, models, optimizers, schedulers, scalers) -> None:
        """Write this snapshot back into the live objects, in place (see the module docstring).

        Raises ValueError, before changing anything, when the objects no longer match it
        (another model, another number of optimizers).
        """
        s = self.structure
        names = model_names(models)
        if list(s["models"]) != names or len(s["optimizers"]) != len(optimizers) \
                or len(s["schedulers"]) != len(schedulers) or len(s["scalers"]) != len(scalers):
            raise ValueError("the script's models, optimizers, schedulers or scalers changed since the snapshot")
        for name, model in zip(names, models):
            live = unwrap(model).state_dict()
            saved = s["models"][name]
            if list(saved) != list(live):
                raise ValueError(f"model {name}'s parameters changed since the snapshot")
        self.fence()
        bufs = self.buffers
        with torch.no_grad():
            for name, model in zip(names, models):
                live = unwrap(model).state_dict()
                for key, slot in s["models"][name].items():
                    if isinstance(slot, _Slot):
                        live[key].copy_(bufs[slot.index], non_blocking=True)
            for opt, saved in zip(optimizers, s["optimizers"]):
                opt.load_state_dict(self._placed(saved))
            for sched, saved in zip(schedulers, s["schedulers"]):
                sched.load_state_dict(self._placed(saved))
            for scaler, saved in zip(scalers, s["scalers"]):
                for name, value in saved.items():
                    live = getattr(scaler, name, None)
                    if isinstance(value, _Slot) and isinstance(live, torch.Tensor):
                        live.copy_(bufs[value.index], non_blocking=True)
                    elif not isinstance(value, _Slot):
                        setattr(scaler, name, copy.deepcopy(value))
        set_rng_state(self.rng)

    def _placed(self, value):
        """A saved structure with each tensor a fresh copy on the device it was taken from:
        never the host buffer itself, which load_state_dict would keep as the live state
        (on CPU) and the next refresh would then overwrite."""
        if isinstance(value, _Slot):
            return self.buffers[value.index].to(self._signature[value.index][2], copy=True, non_blocking=True)
        if isinstance(value, dict):
            return {k: self._placed(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self._placed(v) for v in value]
        if isinstance(value, tuple):
            return tuple(self._placed(v) for v in value)
        return copy.deepcopy(value)

    def tensors(self) -> dict:
        """The snapshot as a plain state (fresh host tensors): for tests and inspection."""
        return {"models": _fill(self.structure["models"], self.buffers),
                "optimizers": _fill(self.structure["optimizers"], self.buffers),
                "schedulers": _fill(self.structure["schedulers"], self.buffers),
                "rng": self.rng}


def side_sources(models, structure: dict, sources: list) -> list[bool]:
    """Which sources the CUDA side stream may copy while the next step's forward runs: the
    parameters and the optimizers' state, which only the next update writes (fenced); the
    models' buffers (a BatchNorm's running statistics change in the forward) and the
    scalers' tensors are copied on the training stream, in its order, still without a wait."""
    params = {p.data_ptr() for m in models for p in m.parameters()}
    in_models = sum(sum(isinstance(v, _Slot) for v in state.values()) for state in structure["models"].values())
    in_optimizers = len(_slots(structure["optimizers"]))
    return [(i < in_models and t.data_ptr() in params) or in_models <= i < in_models + in_optimizers
            for i, t in enumerate(sources)]


def _slots(value) -> list:
    if isinstance(value, _Slot):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _slots(v)]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _slots(v)]
    return []
