"""What the CUDA caching allocator says, read without a sync; the out-of-memory report.

torch is never imported here at module import: the allocator functions only look at a
torch the script already imported, and never initialise CUDA themselves (the memory
history functions, explicit requests, may).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from ..shared import perms
from .na import NA, _na_to_none

# Paths into torch.cuda.memory_stats_as_nested_dict(); the flat memory_stats() names are
# these joined by dots ("allocated_bytes.all.current"), but building that flat, sorted
# dict of ~150 keys costs more than the reading itself.
_ALLOCATOR_KEYS = {
    "allocated_bytes": ("allocated_bytes", "all", "current"),
    "reserved_bytes": ("reserved_bytes", "all", "current"),
    "peak_allocated_bytes": ("allocated_bytes", "all", "peak"),
    "alloc_retries": ("num_alloc_retries",),
    "ooms": ("num_ooms",),
}


def _dig(stats: dict[str, Any], path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(stats, dict) or key not in stats:
            return NA
        stats = stats[key]
    return stats


def _cuda_in_use() -> Any:
    """The script's torch module if it has already initialised CUDA, else None."""
    torch = sys.modules.get("torch")
    try:
        return torch if torch is not None and torch.cuda.is_initialized() else None
    except Exception:
        return None


def cuda_allocator_stats() -> list[dict[str, Any]]:
    """Caching-allocator counters per visible CUDA device; ``[]`` until the script uses CUDA.

    Keys: ``device`` (CUDA index), ``allocated_bytes``, ``reserved_bytes``,
    ``peak_allocated_bytes``, ``alloc_retries``, ``ooms`` (``NA`` if the allocator
    backend does not report one). The allocator keeps these counters on the host: no sync.
    """
    torch = _cuda_in_use()
    if torch is None:
        return []
    try:
        stats = [torch.cuda.memory_stats_as_nested_dict(i) for i in range(torch.cuda.device_count())]
    except Exception:
        return []
    return [
        {"device": i, **{name: _dig(s, path) for name, path in _ALLOCATOR_KEYS.items()}}
        for i, s in enumerate(stats)
    ]


def oom_remedies(alloc_retries: int = 0) -> list[str]:
    """What to try after an out-of-memory error, most effective first."""
    remedies = [
        "Reduce the batch size: activation memory grows with it.",
        "Keep the effective batch with gradient accumulation: several smaller batches "
        "per optimizer.step(), each loss divided by their number.",
        "Use mixed precision: run the forward pass under "
        "torch.autocast('cuda', dtype=torch.bfloat16) to roughly halve activation memory.",
        "Trade compute for memory with activation checkpointing "
        "(torch.utils.checkpoint.checkpoint around large blocks).",
    ]
    if alloc_retries > 0:
        remedies.append(
            f"The allocator had to free its cache and retry {alloc_retries} time(s), a sign of "
            "fragmentation: start the run with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True."
        )
    return remedies


def oom_report(device: Any = None, error: BaseException | None = None) -> dict[str, Any]:
    """Everything worth showing after an out-of-memory error escaped the script (JSON-ready).

    Keys: ``cuda`` (bool), ``device`` (str or None), ``error`` (the exception text or
    None), ``memory_summary`` (``torch.cuda.memory_summary`` text, None without CUDA),
    ``allocator`` (``cuda_allocator_stats()`` with N/A as None), ``remedies`` (strings).
    """
    stats = [{k: _na_to_none(v) for k, v in s.items()} for s in cuda_allocator_stats()]
    summary = None
    torch = _cuda_in_use()
    if torch is not None:
        try:
            summary = torch.cuda.memory_summary(device)
        except Exception:
            pass
    retries = sum(s["alloc_retries"] or 0 for s in stats)
    return {
        "cuda": bool(stats),
        "device": None if device is None else str(device),
        "error": None if error is None else str(error),
        "memory_summary": summary,
        "allocator": stats,
        "remedies": oom_remedies(retries),
    }


def _cuda_available() -> Any:
    """torch if CUDA can be used; these are explicit user requests, so asking may init the driver."""
    try:
        import torch

        return torch if torch.cuda.is_available() else None
    except Exception:
        return None


def memory_history_start(max_entries: int = 100_000) -> bool:
    """Start recording CUDA allocation history (for the memory_viz snapshot); False without CUDA."""
    torch = _cuda_available()
    if torch is None or max_entries <= 0:
        return False
    try:
        torch.cuda.memory._record_memory_history(max_entries=max_entries)
        return True
    except Exception:
        return False


def memory_history_dump(path: str | os.PathLike[str]) -> bool:
    """Write the recorded history as a snapshot pickle (open it at pytorch.org/memory_viz)."""
    torch = _cuda_available()
    if torch is None:
        return False
    try:
        perms.make_dir(Path(path).parent)
        torch.cuda.memory._dump_snapshot(str(path))
        perms.secure(Path(path))
        return True
    except Exception:
        return False


def memory_history_stop() -> bool:
    """Stop recording CUDA allocation history; False without CUDA."""
    torch = _cuda_available()
    if torch is None:
        return False
    try:
        torch.cuda.memory._record_memory_history(enabled=None)
        return True
    except Exception:
        return False
