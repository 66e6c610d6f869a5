"""Sharded parameters (FSDP2's DTensors, FSDP1's flattened shards): what ptdash may read of
them without a collective, and the one place it reduces one across ranks.

A rank holds its shard of each parameter and of its gradient. Its norms are the shard's:
the total gradient norm of the model is the shards' totals reduced across ranks, which is
a collective on the training's process group. ptdash issues one only where every rank is
at the same point of the same step anyway: inside the script's own ``clip_grad_norm_``
(which reduces the same total itself) and under a live clip (applied at the same step on
every rank, and then every step). Everywhere else (the norms of a sampled step, the host
copies of the flush, the update ratios) it reads the local shards, plain tensors, and says
so: their norms are recorded as ``grad/norm_local``, never as the total.
"""

from __future__ import annotations

import math
import sys

import torch

_DTENSOR: list = []


def _dtensor_type():
    """The DTensor class once the script has imported it (no DTensor exists before), else
    None: ptdash never imports torch.distributed.tensor itself (a second of imports)."""
    if not _DTENSOR:
        module = sys.modules.get("torch.distributed.tensor._api")
        if module is None:
            return None
        _DTENSOR.append(module.DTensor)
    return _DTENSOR[0]


def is_dtensor(t) -> bool:
    """Whether ``t`` is a DTensor (FSDP2's parameters and gradients, tensor parallelism)."""
    kind = _dtensor_type()
    return kind is not None and isinstance(t, kind)


def is_sharded(params: list) -> bool:
    """Whether these parameters are shards: DTensors (FSDP2), or FSDP1's flattened ones
    (``FlatParameter`` and, with ``use_orig_params``, the views of the original parameters,
    which FSDP1 marks ``_fsdp_flattened``). Decided once per parameter list (tracked.py)."""
    return any(is_dtensor(p) or getattr(p, "_fsdp_flattened", False) for p in params[:1] + params[-1:])


def local(tensors: list) -> list:
    """Each tensor's local part (a DTensor's shard on this rank, a plain tensor itself): no
    communication, no copy."""
    kind = _dtensor_type()
    if kind is None:
        return list(tensors)
    return [t._local_tensor if isinstance(t, kind) else t for t in tensors]


def full_total(total: torch.Tensor) -> torch.Tensor:
    """A total norm as a plain tensor holding the whole model's value.

    A DTensor total is made whole (a collective when it is still partial: call this only
    where every rank is, inside the script's clip); what ``vector_norm`` over the stacked
    per-parameter norms returns is replicated already, and then nothing is sent."""
    if is_dtensor(total):
        return total.full_tensor()
    return total


def host_readable(t: torch.Tensor) -> torch.Tensor:
    """What the flush may copy to the host of ``t``: itself, a replicated DTensor's local
    value, or NaN (recorded as None) for a DTensor whose value would need a collective;
    the flusher thread never issues one."""
    if not is_dtensor(t):
        return t
    if all(p.is_replicate() for p in t.placements):
        return t._local_tensor
    return torch.full(t._local_tensor.shape, math.nan, dtype=torch.float32, device=t._local_tensor.device)


def all_reduced_norm(local_total: torch.Tensor) -> torch.Tensor:
    """The 2-norm over every rank of shards whose local 2-norm is ``local_total`` (FSDP1's
    flattened shards, sharded over the default process group): a collective."""
    import torch.distributed as dist

    squared = local_total.float() ** 2
    dist.all_reduce(squared)
    return squared.sqrt().to(local_total.dtype)


FSDP1_MODULE = "torch.distributed.fsdp.fully_sharded_data_parallel"
"""Where FullyShardedDataParallel lives: importing it takes two seconds, so ptdash patches
its ``clip_grad_norm_`` when the script imports it (``when_imported``), never before."""


class _AfterImport:
    """A meta-path finder that finds nothing itself: when module ``name`` is imported, its
    loader runs ``then(module)`` once the module has run (a failure there is logged, and the
    import still succeeds). ``remove()`` takes it off the path if it has not fired."""

    def __init__(self, name: str, then) -> None:
        self.name, self._then = name, then

    def find_spec(self, name, path=None, target=None):
        if name != self.name:
            return None
        self.remove()
        import importlib.machinery

        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run, then = spec.loader.exec_module, self._then

        def exec_module(module):
            run(module)
            _call(then, module)

        spec.loader.exec_module = exec_module
        return spec

    def remove(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)


def _call(then, module) -> None:
    try:
        then(module)
    except Exception:  # noqa: BLE001 - the script's import must not fail on ptdash
        import logging

        logging.getLogger("ptdash.sharded").exception("patching %s failed", module.__name__)


def when_imported(name: str, then) -> _AfterImport | None:
    """Run ``then(module)`` now if module ``name`` is imported already, else right after it
    is; the finder to remove at detach, or None."""
    if name in sys.modules:
        _call(then, sys.modules[name])
        return None
    finder = _AfterImport(name, then)
    sys.meta_path.insert(0, finder)
    return finder
