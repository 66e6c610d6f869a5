"""GPU checks for ptdash's system sampling and profiler window; run on a machine with CUDA.

    python benchmarks/gpu_check.py

Prints one PASS/FAIL line per check and exits 1 if any failed. Without CUDA it prints
"no CUDA device: skipped" and exits 0, so it is safe in any CI job.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path

try:
    from ptdash import profiling, system
except ImportError:  # not pip-installed: load the two modules from the source tree

    def _load(name: str):
        path = Path(__file__).resolve().parent.parent / "engine" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(f"ptdash_{name}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    system, profiling = _load("system"), _load("profiling")

import torch

GIB = 2**30
failures: list[str] = []


def check(name: str, ok: bool, detail: str = "") -> None:
    print(f"{'PASS' if ok else 'FAIL'} {name}{': ' + detail if detail else ''}")
    if not ok:
        failures.append(name)


def show(title: str, stats: dict) -> None:
    print(f"  {title}: " + ", ".join(f"{k}={v}" for k, v in stats.items()))


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device: skipped")
        return 0
    nvml = system.NVML()
    sampler = system.SystemSampler(nvml=nvml)
    print(sampler.devices_summary())
    # NVML index of cuda:0, honouring CUDA_VISIBLE_DEVICES.
    nvml0 = (system.visible_nvml_devices(os.environ.get("CUDA_VISIBLE_DEVICES"), nvml.device_count()) or [0])[0]

    check("allocator stats empty before CUDA init", system.cuda_allocator_stats() == [])
    nvml_before = nvml.device_stats(nvml0)
    show("NVML before", nvml_before)
    check("NVML reads every field", all(v is not system.NA for v in nvml_before.values()), nvml.error or "")

    torch.cuda.init()
    alloc_before = system.cuda_allocator_stats()[0]
    show("allocator before", alloc_before)
    tensors = [torch.empty(GIB // 4, dtype=torch.float32, device="cuda:0") for _ in range(2)]  # 2 GiB
    torch.cuda.synchronize()
    alloc_after = system.cuda_allocator_stats()[0]
    nvml_after = nvml.device_stats(nvml0)
    show("allocator after 2 GiB", alloc_after)
    show("NVML after 2 GiB", nvml_after)
    grew = alloc_after["allocated_bytes"] - alloc_before["allocated_bytes"]
    check("allocator allocated_bytes grew by 2 GiB", grew >= 2 * GIB, f"+{grew / GIB:.2f} GiB")
    check("allocator reserved >= allocated", alloc_after["reserved_bytes"] >= alloc_after["allocated_bytes"])
    if nvml_before["mem_used_bytes"] is system.NA or nvml_after["mem_used_bytes"] is system.NA:
        check("NVML mem_used grew", False, "N/A")
    else:
        nvml_grew = nvml_after["mem_used_bytes"] - nvml_before["mem_used_bytes"]
        check("NVML mem_used grew by >= 2 GiB", nvml_grew >= 2 * GIB, f"+{nvml_grew / GIB:.2f} GiB")
    proc_mem = nvml.process_mem_bytes(nvml0, [os.getpid()])
    # In a container NVML lists host PIDs, so N/A here is expected there, not a failure.
    check("NVML memory of this process", proc_mem is system.NA or proc_mem >= 2 * GIB, f"{proc_mem}")

    # The sampler must not add a device-to-host sync: "error" mode raises on any sync.
    torch.cuda.set_sync_debug_mode("error")
    try:
        sampler.sample()
        start = time.perf_counter()
        sample = sampler.sample()
        cost_ms = (time.perf_counter() - start) * 1e3
        check("sample() under sync debug mode 'error'", True, f"{cost_ms:.2f} ms")
    except RuntimeError as exc:
        check("sample() under sync debug mode 'error'", False, str(exc))
        sample = sampler.sample()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    show("sample", {k: v for k, v in sample.items() if k.startswith("gpu0/")})
    check("sample has gpu0 allocator and NVML values",
          bool(sample.get("gpu0/mem_allocated_bytes")) and sample.get("gpu0/nvml_mem_used_bytes") is not None)
    del tensors
    torch.cuda.empty_cache()

    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda()
    opt = torch.optim.AdamW(model.parameters())
    with tempfile.TemporaryDirectory() as tmp:
        window = profiling.ProfileWindow(steps=3, out_dir=Path(tmp), step_index=10)
        window.start()
        for _ in range(10):
            opt.zero_grad()
            model(torch.randn(256, 1024, device="cuda")).square().mean().backward()
            opt.step()
            if window.on_step():
                break
        summary = window.finish()
        check("profile has no error", "error" not in summary, summary.get("error", ""))
        check("profile device is cuda", summary["device"] == "cuda")
        check("trace written", summary["trace"] is not None and Path(summary["trace"]).stat().st_size > 0,
              str(summary["trace"]))
        print("  top 5 by self CUDA time:")
        for row in summary["top"][:5]:
            print(f"    {row['name'][:60]:60} calls={row['calls']:4} self_cuda={row['self_device_ms']:8.3f} ms "
                  f"self_cpu={row['self_ms']:8.3f} ms")
        check("top op has CUDA time", bool(summary["top"]) and summary["top"][0]["self_device_ms"] > 0)

        check("memory history start", system.memory_history_start(10_000))
        torch.randn(1024, 1024, device="cuda").sum()
        snapshot = Path(tmp) / "snapshot.pickle"
        check("memory history dump", system.memory_history_dump(snapshot) and snapshot.stat().st_size > 0)
        system.memory_history_stop()

    total = torch.cuda.get_device_properties(0).total_memory
    try:
        torch.empty(4 * total, dtype=torch.uint8, device="cuda:0")
        check("huge allocation raised OutOfMemoryError", False)
    except torch.OutOfMemoryError as exc:
        report = system.oom_report(0, exc)
        print(f"  oom error: {report['error'][:120]}")
        print("  remedies:\n    " + "\n    ".join(report["remedies"]))
        check("oom_report sees CUDA", report["cuda"] and bool(report["memory_summary"]))
        check("oom_report counts the OOM", report["allocator"][0]["ooms"] >= 1, f"{report['allocator'][0]}")

    print(f"{len(failures)} failed: {', '.join(failures)}" if failures else "all checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
