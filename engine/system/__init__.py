"""System sampling for the engine: host CPU and memory, the CUDA caching allocator, NVML.

A background thread of the training process calls ``SystemSampler.sample()`` a few times
a second, so every call here is cheap and none of them syncs a CUDA stream. Missing
hardware degrades instead of failing: no NVML library, no driver, no CUDA or a vanished
process yields ``NA`` (``None`` in the flat sample), never an exception into training.

torch is never imported at module import. The allocator functions only look at a torch
that the script has already imported, and never initialise CUDA themselves.
"""

from __future__ import annotations

import os
from typing import Any

from ..shared import names
from .cuda import (
    _cuda_in_use,
    cuda_allocator_stats,
    memory_history_dump,
    memory_history_start,
    memory_history_stop,
    oom_remedies,
    oom_report,
)
from .host import HostSampler, descendant_pids
from .na import NA, _na_to_none, _NAType
from .nvml import DEVICE_FIELDS, NVML, visible_nvml_devices

__all__ = ["NA", "NVML", "DEVICE_FIELDS", "HostSampler", "SystemSampler", "cuda_allocator_stats", "descendant_pids",
           "memory_history_dump", "memory_history_start", "memory_history_stop", "oom_remedies", "oom_report",
           "visible_nvml_devices", "_NAType"]


_ALLOCATOR_METRICS = {
    "allocated_bytes": "mem_allocated_bytes",
    "reserved_bytes": "mem_reserved_bytes",
    "peak_allocated_bytes": "mem_peak_bytes",
    "alloc_retries": "alloc_retries",
    "ooms": "ooms",
}
_NVML_METRICS = {
    "utilization_pct": "nvml_util_pct",
    "mem_used_bytes": "nvml_mem_used_bytes",
    "mem_total_bytes": "nvml_mem_total_bytes",
    "temperature_c": "temperature_c",
    "power_w": "power_w",
    "power_limit_w": "power_limit_w",
    "sm_clock_mhz": "sm_clock_mhz",
    "mem_clock_mhz": "mem_clock_mhz",
}


class SystemSampler:
    """Host, allocator and NVML readings as one flat dict of scoped, unit-named metrics.

    GPUs are numbered as CUDA numbers them in this process (``CUDA_VISIBLE_DEVICES``
    applied), so ``gpu0`` is ``cuda:0``. Every GPU has the same keys; what cannot be read
    (allocator before the script uses CUDA, NVML without a driver) is None.
    """

    def __init__(self, nvml: NVML | None = None, host: HostSampler | None = None) -> None:
        self._nvml = nvml or NVML()
        self._host = host or HostSampler()

    def sample(self) -> dict[str, float | None]:
        """One reading: ``host/<metric>`` and ``gpu<i>/<metric>``; call from a background thread."""
        out: dict[str, float | None] = {names.host(k): _na_to_none(v) for k, v in self._host.sample().items()}
        allocator = cuda_allocator_stats()
        nvml_ids = self._visible()
        pids = self._host.pids()
        for i in range(max(len(allocator), len(nvml_ids))):
            alloc = allocator[i] if i < len(allocator) else {}
            for key, metric in _ALLOCATOR_METRICS.items():
                out[names.gpu(i, metric)] = _na_to_none(alloc.get(key))
            device = self._nvml.device_stats(nvml_ids[i]) if i < len(nvml_ids) else {}
            for key, metric in _NVML_METRICS.items():
                out[names.gpu(i, metric)] = _na_to_none(device.get(key))
            proc_mem = self._nvml.process_mem_bytes(nvml_ids[i], pids) if i < len(nvml_ids) else NA
            out[names.gpu(i, "proc_mem_bytes")] = _na_to_none(proc_mem)
        return out

    def devices_summary(self) -> str:
        """One human line naming the GPUs, e.g. "1 CUDA device: gpu0 NVIDIA H200 139.8 GiB (driver 550.54.15)"."""
        nvml_ids = self._visible()
        if nvml_ids:
            names = [
                f"gpu{i} {self._nvml.device_name(d)} {_gib(self._nvml.device_stats(d)['mem_total_bytes'])}"
                for i, d in enumerate(nvml_ids)
            ]
            return _devices_line(names, f" (driver {self._nvml.driver_version()})")
        torch = _cuda_in_use()
        if torch is None:
            return "no CUDA device"
        try:
            count = torch.cuda.device_count()
            props = [torch.cuda.get_device_properties(i) for i in range(count)]
        except Exception:
            return "CUDA in use, devices N/A"
        return _devices_line([f"gpu{i} {p.name} {_gib(p.total_memory)}" for i, p in enumerate(props)], "")

    def _visible(self) -> list[int | str]:
        # Read the variable each time: scripts often set it themselves before using CUDA.
        if not self._nvml.available():
            return []
        return visible_nvml_devices(os.environ.get("CUDA_VISIBLE_DEVICES"), self._nvml.device_count())


def _devices_line(names: list[str], suffix: str) -> str:
    if not names:
        return "no CUDA device"
    return f"{len(names)} CUDA device{'s' if len(names) > 1 else ''}: {', '.join(names)}{suffix}"


def _gib(n: Any) -> str:
    return f"{n / 2**30:.1f} GiB" if isinstance(n, (int, float)) else "N/A"
