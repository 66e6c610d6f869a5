"""System sampling for the engine: host CPU and memory, the CUDA caching allocator, NVML.

A background thread of the training process calls ``SystemSampler.sample()`` a few times
a second, so every call here is cheap and none of them syncs a CUDA stream. Missing
hardware degrades instead of failing: no NVML library, no driver, no CUDA or a vanished
process yields ``NA`` (``None`` in the flat sample), never an exception into training.

torch is never imported at module import. The allocator functions only look at a torch
that the script has already imported, and never initialise CUDA themselves.
"""

from __future__ import annotations

import math
import os
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any, Sequence

import psutil

# ------------------------------------------------------------------------------ NA


class _NAType:
    """The type of ``NA``: a missing value that prints as "N/A" and is falsy."""

    __slots__ = ()
    _instance: _NAType | None = None

    def __new__(cls) -> _NAType:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NA"

    def __str__(self) -> str:
        return "N/A"

    def __bool__(self) -> bool:
        return False

    def __format__(self, spec: str) -> str:
        # NA stands where a number would be, so a numeric spec such as ">8.1f" must not
        # raise; keep its fill, alignment and width and drop the rest.
        match = _FORMAT_SPEC.match(spec)
        if match is None:
            return "N/A"
        align = match["align"] or ("<" if match["type"] == "s" else ">")
        return format("N/A", f"{match['fill'] or ''}{'>' if align == '=' else align}{match['width'] or ''}")


_FORMAT_SPEC = re.compile(
    r"(?:(?P<fill>.)?(?P<align>[<>=^]))?[-+ ]?z?#?0?(?P<width>\d+)?[,_]?(?:\.\d+)?(?P<type>[bcdeEfFgGnosxX%])?\Z",
    re.DOTALL,
)

NA = _NAType()
"""The value of a metric that could not be read: ``str(NA) == "N/A"``, ``bool(NA) is False``."""


def _na_to_none(value: Any) -> Any:
    return None if value is NA else value


# ---------------------------------------------------------------------------- NVML

# NVML enum values; they are part of the stable C ABI, and spelling them here lets a fake
# library in tests omit the constants.
_TEMPERATURE_GPU = 0
_CLOCK_SM = 1
_CLOCK_MEM = 2

DEVICE_FIELDS = (
    "utilization_pct",
    "mem_used_bytes",
    "mem_total_bytes",
    "temperature_c",
    "power_w",
    "power_limit_w",
    "sm_clock_mhz",
    "mem_clock_mhz",
)
"""Keys of ``NVML.device_stats()``."""


class NVML:
    """The one gateway for every NVML call: initialises lazily, returns ``NA`` on failure.

    A device is named by its NVML index (``int``) or its UUID (``str``, e.g. ``"GPU-..."``).
    ``lib`` replaces the ``pynvml`` module, for tests; ``error`` says why NVML is unusable.
    """

    def __init__(self, lib: Any = None) -> None:
        self._lib = lib
        self._ready: bool | None = None
        self._lock = threading.Lock()
        self._handles: dict[int | str, Any] = {}
        self.error: str | None = None
        """Why NVML could not be initialised, or None."""

    def available(self) -> bool:
        """Whether NVML initialised (tries once, on the first call of any method)."""
        if self._ready is None:
            with self._lock:
                if self._ready is None:
                    try:
                        if self._lib is None:
                            import pynvml

                            self._lib = pynvml
                        self._lib.nvmlInit()
                        self._ready = True
                    # Broad on purpose: ImportError, NVMLError_LibraryNotFound,
                    # DriverNotLoaded, OSError from ctypes... all mean "no NVML here".
                    except Exception as exc:
                        self.error = f"{type(exc).__name__}: {exc}"
                        self._ready = False
        return self._ready

    def call(self, name: str, *args: Any) -> Any:
        """``pynvml.<name>(*args)``, or ``NA`` if NVML is unavailable or the call fails."""
        if not self.available():
            return NA
        try:
            return getattr(self._lib, name)(*args)
        # Old drivers lack functions (AttributeError/NVMLError_FunctionNotFound) and
        # many queries are NotSupported on some boards; each is just a missing value.
        except Exception:
            return NA

    def device_count(self) -> int | _NAType:
        """Number of GPUs NVML sees (ignores ``CUDA_VISIBLE_DEVICES``)."""
        return self.call("nvmlDeviceGetCount")

    def device_name(self, index: int | str) -> str | _NAType:
        """Marketing name of the device, e.g. "NVIDIA H200"."""
        name = self.call("nvmlDeviceGetName", self._handle(index))
        return name.decode() if isinstance(name, bytes) else name

    def driver_version(self) -> str | _NAType:
        """The driver version string, e.g. "550.54.15"."""
        version = self.call("nvmlSystemGetDriverVersion")
        return version.decode() if isinstance(version, bytes) else version

    def device_stats(self, index: int | str) -> dict[str, Any]:
        """Utilisation, memory, temperature, power and clocks; each key is ``NA`` alone if its call fails."""
        handle = self._handle(index)
        if handle is NA:
            return dict.fromkeys(DEVICE_FIELDS, NA)
        util = self.call("nvmlDeviceGetUtilizationRates", handle)
        mem = self.call("nvmlDeviceGetMemoryInfo", handle)
        return {
            "utilization_pct": _field(util, "gpu"),
            "mem_used_bytes": _field(mem, "used"),
            "mem_total_bytes": _field(mem, "total"),
            "temperature_c": self.call("nvmlDeviceGetTemperature", handle, _TEMPERATURE_GPU),
            "power_w": _milli(self.call("nvmlDeviceGetPowerUsage", handle)),
            "power_limit_w": _milli(self.call("nvmlDeviceGetEnforcedPowerLimit", handle)),
            "sm_clock_mhz": self.call("nvmlDeviceGetClockInfo", handle, _CLOCK_SM),
            "mem_clock_mhz": self.call("nvmlDeviceGetClockInfo", handle, _CLOCK_MEM),
        }

    def process_mem_bytes(self, index: int | str, pids: Sequence[int]) -> int | _NAType:
        """GPU memory that the processes ``pids`` hold on this device.

        ``NA`` when none of them is listed: NVML lists host PIDs, so inside a container
        "not listed" cannot be told apart from "uses no memory".
        """
        handle = self._handle(index)
        if handle is NA:
            return NA
        wanted = set(pids)
        used: dict[int, int] = {}
        for query in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            procs = self.call(query, handle)
            for proc in procs or ():
                memory = getattr(proc, "usedGpuMemory", None)
                # A process with both a compute and a graphics context is listed twice.
                if proc.pid in wanted and memory is not None:
                    used[proc.pid] = memory
        return sum(used.values()) if used else NA

    def _handle(self, index: int | str) -> Any:
        handle = self._handles.get(index)
        if handle is None:
            query = "nvmlDeviceGetHandleByUUID" if isinstance(index, str) else "nvmlDeviceGetHandleByIndex"
            handle = self.call(query, index)
            if handle is not NA:
                self._handles[index] = handle
        return handle


def _field(obj: Any, name: str) -> Any:
    return NA if obj is NA else getattr(obj, name, NA)


def _milli(value: Any) -> Any:
    return NA if value is NA else value / 1000.0


def visible_nvml_devices(env: str | None, count: int | _NAType) -> list[int | str]:
    """NVML ids of the GPUs CUDA shows this process, in CUDA order.

    ``env`` is ``CUDA_VISIBLE_DEVICES``: indices or ``GPU-``/``MIG-`` UUIDs. Like CUDA,
    parsing stops at the first entry that is not a valid device.
    """
    if env is None:
        return list(range(count)) if isinstance(count, int) else []
    devices: list[int | str] = []
    for token in env.split(","):
        token = token.strip()
        if token.isdigit() and (not isinstance(count, int) or int(token) < count):
            devices.append(int(token))
        elif token.startswith(("GPU-", "MIG-")):
            devices.append(token)
        else:
            break
    return devices


# ----------------------------------------------------------------- CUDA allocator

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
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        torch.cuda.memory._dump_snapshot(str(path))
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


# ---------------------------------------------------------------------------- host


def descendant_pids(pid: int) -> list[int] | None:
    """Every process below ``pid``, from the kernel's per-thread children lists.

    Reads ``/proc/<pid>/task/<tid>/children`` (Linux, CONFIG_PROC_CHILDREN): a few files
    per process in the tree, where listing children through psutil reads every process
    on the machine. None where those files do not exist.
    """
    out: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            if parent == pid:
                return None
            continue  # a descendant that just exited
        for tid in tasks:
            try:
                with open(f"/proc/{parent}/task/{tid}/children", "rb") as f:
                    children = [int(c) for c in f.read().split()]
            except FileNotFoundError:
                if not os.path.exists(f"/proc/{parent}/task/{tid}"):
                    continue  # the thread ended meanwhile
                return None  # the kernel does not keep children lists
            except OSError:
                continue
            out.extend(children)
            todo.extend(children)
    return out


class HostSampler:
    """CPU and memory of the host, this process, and its children (DataLoader workers).

    CPU percentages are averages since the previous ``sample()``, so the first one is
    ``NA``. Process CPU is in units of one core (200 = two busy cores), as in top.
    """

    def __init__(self, proc: psutil.Process | None = None, children_every_s: float = 2.0) -> None:
        if children_every_s < 0:
            raise ValueError(f"children_every_s must be >= 0, got {children_every_s}")
        self._proc = proc or psutil.Process()
        self._children_every_s = children_every_s
        self._children: dict[int, psutil.Process] = {}
        self._children_at = -math.inf
        self._cpu_times: tuple[float, float] | None = None
        self._primed = False

    def pids(self) -> list[int]:
        """This process and its known children."""
        return [self._proc.pid, *self._children]

    def sample(self) -> dict[str, Any]:
        """Keys: ``cpu_pct`` (machine, 0-100), ``proc_cpu_pct``, ``workers_cpu_pct``,
        ``rss_bytes``, ``workers_rss_bytes``, ``workers`` (count), ``mem_used_bytes``,
        ``mem_total_bytes`` (machine; used = total - available)."""
        primed = self._primed
        self._primed = True
        try:
            with self._proc.oneshot():
                proc_cpu = self._proc.cpu_percent()
                rss = self._proc.memory_info().rss
        except psutil.Error:
            proc_cpu, rss = NA, NA
        workers_cpu, workers_rss = self._sample_children()
        memory = psutil.virtual_memory()
        return {
            "cpu_pct": self._machine_cpu_pct(),
            "proc_cpu_pct": proc_cpu if primed else NA,
            "workers_cpu_pct": workers_cpu if primed else NA,
            "rss_bytes": rss,
            "workers_rss_bytes": workers_rss,
            "workers": len(self._children),
            "mem_used_bytes": memory.total - memory.available,
            "mem_total_bytes": memory.total,
        }

    def _sample_children(self) -> tuple[float, int]:
        # The list of children is refreshed every few seconds; known children are read each time.
        now = time.monotonic()
        if now - self._children_at >= self._children_every_s:
            self._children_at = now
            pids = descendant_pids(self._proc.pid)
            found = []
            if pids is None:  # no /proc/<pid>/task/<tid>/children here: scan every process
                try:
                    found = self._proc.children(recursive=True)
                except psutil.Error:
                    pass
            for pid in pids or ():
                try:
                    found.append(psutil.Process(pid))
                except psutil.Error:
                    pass  # already gone
            # Keep the old Process objects: they carry the CPU-time baseline. Equality
            # also compares creation time, so a recycled PID gets a fresh object.
            known = self._children
            self._children = {c.pid: known[c.pid] if known.get(c.pid) == c else c for c in found}
        cpu, rss = 0.0, 0
        for pid, child in list(self._children.items()):
            try:
                with child.oneshot():
                    # A child's first reading is 0.0 (no baseline yet): it shows up one sample late.
                    cpu += child.cpu_percent()
                    # RSS counts copy-on-write pages shared with the parent again in every
                    # fork()ed worker; USS would not, but reading smaps is far too slow here.
                    rss += child.memory_info().rss
            except psutil.Error:
                del self._children[pid]
        return cpu, rss

    def _machine_cpu_pct(self) -> float | _NAType:
        times = psutil.cpu_times()
        # As psutil does: guest time is already inside user time, and iowait is idle.
        total = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
        busy = total - times.idle - getattr(times, "iowait", 0.0)
        previous, self._cpu_times = self._cpu_times, (busy, total)
        if previous is None or total <= previous[1]:
            return NA
        return min(100.0, max(0.0, 100.0 * (busy - previous[0]) / (total - previous[1])))


# ------------------------------------------------------------------------- sampler

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
        out: dict[str, float | None] = {f"host/{k}": _na_to_none(v) for k, v in self._host.sample().items()}
        allocator = cuda_allocator_stats()
        nvml_ids = self._visible()
        pids = self._host.pids()
        for i in range(max(len(allocator), len(nvml_ids))):
            alloc = allocator[i] if i < len(allocator) else {}
            for key, metric in _ALLOCATOR_METRICS.items():
                out[f"gpu{i}/{metric}"] = _na_to_none(alloc.get(key))
            device = self._nvml.device_stats(nvml_ids[i]) if i < len(nvml_ids) else {}
            for key, metric in _NVML_METRICS.items():
                out[f"gpu{i}/{metric}"] = _na_to_none(device.get(key))
            proc_mem = self._nvml.process_mem_bytes(nvml_ids[i], pids) if i < len(nvml_ids) else NA
            out[f"gpu{i}/proc_mem_bytes"] = _na_to_none(proc_mem)
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
