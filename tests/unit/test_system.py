"""System sampling: NA, the NVML gateway (real and faked at the hardware boundary), host, CUDA, OOM."""

from __future__ import annotations

import json
import sys
import time
from types import SimpleNamespace

import pytest

from ptdash import system

NA = system.NA

try:
    from pynvml import NVMLError
except ImportError:
    NVMLError = RuntimeError


class FakeNVML:
    """A pynvml stand-in with one GPU; ``broken`` names calls that raise NVMLError."""

    def __init__(self, broken: tuple[str, ...] = (), procs: list = ()) -> None:
        self.broken = broken
        self.procs = list(procs)

    def __getattr__(self, name):
        raise AttributeError(name)

    def _check(self, name):
        if name in self.broken:
            raise NVMLError(3)  # NVML_ERROR_NOT_SUPPORTED

    def nvmlInit(self):
        self._check("nvmlInit")

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, i):
        if i != 0:
            raise NVMLError(2)  # NVML_ERROR_INVALID_ARGUMENT
        return "h0"

    def nvmlDeviceGetName(self, h):
        return b"Fake GPU"

    def nvmlSystemGetDriverVersion(self):
        return "1.2.3"

    def nvmlDeviceGetUtilizationRates(self, h):
        self._check("util")
        return SimpleNamespace(gpu=42, memory=10)

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=3 * 2**30, total=80 * 2**30, free=77 * 2**30)

    def nvmlDeviceGetTemperature(self, h, sensor):
        self._check("temperature")
        return 55

    def nvmlDeviceGetPowerUsage(self, h):
        self._check("power")
        return 123456  # milliwatts

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return 700000

    def nvmlDeviceGetClockInfo(self, h, clock):
        return {1: 1980, 2: 2619}[clock]

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return self.procs

    def nvmlDeviceGetGraphicsRunningProcesses(self, h):
        return [p for p in self.procs if p.pid == 100]


# ---------------------------------------------------------------------------- NA


def test_na_prints_as_na_and_is_falsy():
    assert str(NA) == "N/A" and f"{NA}" == "N/A" and not NA
    assert system._NAType() is NA


@pytest.mark.parametrize(
    ("spec", "expected"),
    [("", "N/A"), (">8.1f", "     N/A"), ("8", "     N/A"), ("<6s", "N/A   "), (",.0f", "N/A"),
     ("*^9", "***N/A***"), (".1", "N/A"), ("08.2f", "     N/A"), ("=+6d", "   N/A")],
)
def test_na_formats_under_numeric_specs(spec, expected):
    assert format(NA, spec) == expected


# -------------------------------------------------------------------------- NVML


def test_nvml_on_this_machine_never_raises():
    nvml = system.NVML()
    if nvml.available():
        pytest.skip("NVML works here; the degraded path is covered by the fakes")
    assert nvml.error
    assert nvml.device_count() is NA
    assert nvml.device_stats(0) == dict.fromkeys(system.DEVICE_FIELDS, NA)
    assert nvml.process_mem_bytes(0, [1]) is NA
    assert nvml.device_name("GPU-0000") is NA


def test_nvml_without_pynvml_module(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    nvml = system.NVML()
    assert nvml.device_count() is NA and "pynvml" in nvml.error


def test_nvml_init_failure_is_na():
    nvml = system.NVML(lib=FakeNVML(broken=("nvmlInit",)))
    assert not nvml.available()
    assert nvml.device_stats(0)["temperature_c"] is NA


def test_nvml_failing_fields_are_na_alone():
    stats = system.NVML(lib=FakeNVML(broken=("temperature", "power"))).device_stats(0)
    assert stats == {
        "utilization_pct": 42,
        "mem_used_bytes": 3 * 2**30,
        "mem_total_bytes": 80 * 2**30,
        "temperature_c": NA,
        "power_w": NA,
        "power_limit_w": 700.0,
        "sm_clock_mhz": 1980,
        "mem_clock_mhz": 2619,
    }


def test_nvml_unknown_device_is_na():
    assert system.NVML(lib=FakeNVML()).device_stats(5) == dict.fromkeys(system.DEVICE_FIELDS, NA)


def test_process_mem_sums_given_pids_once_each():
    procs = [SimpleNamespace(pid=100, usedGpuMemory=1000), SimpleNamespace(pid=200, usedGpuMemory=500),
             SimpleNamespace(pid=300, usedGpuMemory=None), SimpleNamespace(pid=400, usedGpuMemory=7)]
    nvml = system.NVML(lib=FakeNVML(procs=procs))
    assert nvml.process_mem_bytes(0, [100, 200, 300]) == 1500  # 100 is listed twice (compute + graphics)
    assert nvml.process_mem_bytes(0, [999]) is NA


@pytest.mark.parametrize(
    ("env", "count", "expected"),
    [(None, 2, [0, 1]), (None, NA, []), ("", 4, []), ("1,0", 4, [1, 0]), ("2,9,1", 4, [2]),
     ("GPU-abc, 1", 4, ["GPU-abc", 1]), ("1,-1,0", 4, [1])],
)
def test_visible_devices_follow_cuda_rules(env, count, expected):
    assert system.visible_nvml_devices(env, count) == expected


# ------------------------------------------------------------------- host / CUDA


def test_host_sampler_reads_sane_values():
    host = system.HostSampler()
    first = host.sample()
    assert first["cpu_pct"] is NA and first["proc_cpu_pct"] is NA  # no baseline yet
    # Some clock ticks of every CPU between the samples, however fast or loaded the machine
    # (the machine's counters move in ticks of 10 ms: a sum done within one read NA).
    started = time.perf_counter()
    while time.perf_counter() - started < 0.05:
        sum(i * i for i in range(10_000))
    second = host.sample()
    assert second["rss_bytes"] > 0
    assert second["mem_total_bytes"] > second["mem_used_bytes"] > 0
    assert 0.0 <= second["cpu_pct"] <= 100.0
    assert second["proc_cpu_pct"] >= 0.0






def test_cuda_stats_empty_without_cuda():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_initialized():
        pytest.skip("CUDA in use")
    assert system.cuda_allocator_stats() == []


def test_oom_report_on_cpu():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_initialized():
        pytest.skip("CUDA in use")
    try:
        raise torch.OutOfMemoryError("Tried to allocate 1.00 TiB")
    except torch.OutOfMemoryError as exc:
        report = system.oom_report(error=exc)
    json.dumps(report)
    assert report["cuda"] is False and report["memory_summary"] is None and report["allocator"] == []
    assert report["error"] == "Tried to allocate 1.00 TiB"
    assert any("batch size" in r for r in report["remedies"])
    assert not any("expandable_segments" in r for r in report["remedies"])


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch.cuda as a process with one initialised GPU sees it (faked at the hardware boundary)."""
    torch = pytest.importorskip("torch")
    nested = {
        "allocated_bytes": {"all": {"current": 3 * 2**30, "peak": 5 * 2**30}, "large_pool": {"current": 0}},
        "reserved_bytes": {"all": {"current": 4 * 2**30, "peak": 6 * 2**30}},
        "num_alloc_retries": 2,
        "num_ooms": 1,
    }
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "memory_stats_as_nested_dict", lambda i: nested)
    monkeypatch.setattr(torch.cuda, "memory_summary", lambda device=None: f"summary of {device}")


def test_allocator_stats_from_nested_counters(fake_cuda):
    assert system.cuda_allocator_stats() == [{
        "device": 0, "allocated_bytes": 3 * 2**30, "reserved_bytes": 4 * 2**30,
        "peak_allocated_bytes": 5 * 2**30, "alloc_retries": 2, "ooms": 1,
    }]


def test_oom_report_with_cuda(fake_cuda):
    report = system.oom_report(0)
    json.dumps(report)
    assert report["cuda"] and report["device"] == "0" and report["memory_summary"] == "summary of 0"
    assert report["allocator"][0]["ooms"] == 1
    assert any("expandable_segments:True" in r for r in report["remedies"])


def test_sampler_without_nvml_still_reports_allocator(fake_cuda):
    out = system.SystemSampler(nvml=system.NVML(lib=FakeNVML(broken=("nvmlInit",)))).sample()
    assert out["gpu0/mem_reserved_bytes"] == 4 * 2**30 and out["gpu0/ooms"] == 1
    assert out["gpu0/nvml_util_pct"] is None and out["gpu0/proc_mem_bytes"] is None


def test_devices_summary_from_torch_without_nvml(fake_cuda, monkeypatch):
    torch = pytest.importorskip("torch")
    props = SimpleNamespace(name="Fake GPU", total_memory=16 * 2**30)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    sampler = system.SystemSampler(nvml=system.NVML(lib=FakeNVML(broken=("nvmlInit",))))
    assert sampler.devices_summary() == "1 CUDA device: gpu0 Fake GPU 16.0 GiB"


def test_remedies_suggest_expandable_segments_after_retries():
    assert any("expandable_segments:True" in r for r in system.oom_remedies(alloc_retries=3))


def test_memory_history_noops_without_cuda(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    assert system.memory_history_start(1000) is False
    assert system.memory_history_dump(tmp_path / "snap.pickle") is False
    assert not (tmp_path / "snap.pickle").exists()


# ------------------------------------------------------------------------ sampler


def test_sampler_flat_names_with_fake_gpu(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    procs = [SimpleNamespace(pid=0, usedGpuMemory=2048)]
    sampler = system.SystemSampler(nvml=system.NVML(lib=FakeNVML(broken=("power",), procs=procs)))
    sampler._host.pids = lambda: [0]
    out = sampler.sample()
    assert out["gpu0/nvml_util_pct"] == 42 and out["gpu0/nvml_mem_total_bytes"] == 80 * 2**30
    assert out["gpu0/temperature_c"] == 55 and out["gpu0/sm_clock_mhz"] == 1980
    assert out["gpu0/power_w"] is None  # N/A becomes None
    assert out["gpu0/proc_mem_bytes"] == 2048
    assert out["gpu0/mem_allocated_bytes"] is None  # the allocator has not been used
    assert out["host/rss_bytes"] > 0
    assert all(v is None or isinstance(v, (int, float)) for v in out.values())
    assert sampler.devices_summary() == "1 CUDA device: gpu0 Fake GPU 80.0 GiB (driver 1.2.3)"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert not any(k.startswith("gpu") for k in sampler.sample())


def test_sampler_on_this_machine_reports_the_host():
    # (What sampling costs a step is in the engine's overhead, benchmarks/overhead.py, not a timed test's to say.)
    sampler = system.SystemSampler()
    out = sampler.sample()
    if not sampler._nvml.available() and not system.cuda_allocator_stats():
        assert sampler.devices_summary() == "no CUDA device"
        assert sorted(out) == sorted(f"host/{k}" for k in system.HostSampler().sample())
    again = sampler.sample()
    assert again["host/rss_bytes"] > 0 and sorted(again) == sorted(out)
