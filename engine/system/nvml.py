"""The one gateway for every NVML call: lazy, and ``NA`` on any failure.

No NVML library, no driver, a board that does not support a query: each is a missing
value, never an exception into training.
"""

from __future__ import annotations

import threading
from typing import Any, Sequence

from .na import NA, _NAType

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
