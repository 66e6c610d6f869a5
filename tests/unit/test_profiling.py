"""The profiler window: summarize() on fake rows, and a real window over a tiny CPU model."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

try:
    from ptdash import profiling
except ImportError:  # not pip-installed yet: load the module from its file
    import importlib.util

    _spec = importlib.util.spec_from_file_location(
        "ptdash_profiling", Path(__file__).resolve().parents[2] / "engine" / "profiling.py"
    )
    profiling = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(profiling)


def row(key, self_cpu, self_dev=0.0, count=1, legacy=False):
    """A FunctionEventAvg look-alike; times in microseconds as the profiler reports them."""
    dev = "cuda" if legacy else "device"
    return SimpleNamespace(
        key=key, count=count, self_cpu_time_total=self_cpu, cpu_time_total=2 * self_cpu,
        **{f"self_{dev}_time_total": self_dev, f"{dev}_time_total": 2 * self_dev,
           "self_cpu_memory_usage": 64, f"self_{dev}_memory_usage": 128},
    )


def test_summarize_sorts_by_self_cpu_time_on_cpu():
    top = profiling.summarize([row("a", 10), row("b", 3000, count=4), row("c", 500)], "cpu")
    assert [r["name"] for r in top] == ["b", "c", "a"]
    assert top[0] == {"name": "b", "calls": 4, "self_ms": 3.0, "total_ms": 6.0, "self_device_ms": 0.0,
                      "total_device_ms": 0.0, "cpu_mem_bytes": 64, "device_mem_bytes": 128}


def test_summarize_sorts_by_self_device_time_on_cuda_and_limits():
    rows = [row("launch", 900, 1), row("gemm", 5, 4000), row("softmax", 5, 200, legacy=True)]
    top = profiling.summarize(rows, "cuda", limit=2)
    assert [r["name"] for r in top] == ["gemm", "softmax"]
    assert top[1]["self_device_ms"] == 0.2 and top[1]["total_device_ms"] == 0.4  # cuda_* names still read
    json.dumps(top)


def test_summarize_tolerates_missing_columns():
    top = profiling.summarize([SimpleNamespace(key="x", count=2, self_cpu_time_total=1000, cpu_time_total=1000)], "cpu")
    assert top[0]["self_device_ms"] == 0.0 and top[0]["device_mem_bytes"] == 0


def _train(model, opt, window, max_steps=10):
    for _ in range(max_steps):
        opt.zero_grad()
        model(torch.randn(8, 16)).pow(2).mean().backward()
        opt.step()
        if window.on_step():
            return


def test_real_window_on_cpu(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    window = profiling.ProfileWindow(steps=3, out_dir=tmp_path / "profiles", step_index=5)
    window.start()
    _train(model, opt, window)
    summary = window.finish()
    json.dumps(summary)
    assert "error" not in summary
    assert summary["steps"] == [5, 7] and summary["device"] == ("cuda" if torch.cuda.is_available() else "cpu")
    trace = Path(summary["trace"])
    assert trace.name == "profile-step5-7.json"
    assert json.loads(trace.read_text())["traceEvents"]
    matmuls = [r for r in summary["top"] if r["name"] in ("aten::mm", "aten::addmm")]
    assert matmuls and matmuls[0]["self_ms"] > 0 and matmuls[0]["calls"] >= 3
    assert 0 < len(summary["top"]) <= profiling.TOP_LIMIT


def test_stop_on_training_thread_then_report_elsewhere(tmp_path):
    model = torch.nn.Linear(16, 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    window = profiling.ProfileWindow(steps=1, out_dir=tmp_path, step_index=0)
    window.start()
    _train(model, opt, window)
    window.stop()
    result = []
    worker = threading.Thread(target=lambda: result.append(window.report()))
    worker.start()
    worker.join()
    assert "error" not in result[0] and Path(result[0]["trace"]).name == "profile-step0-0.json"
    assert "error" in window.report()  # the events were released after the first report


def test_window_counts_steps():
    window = profiling.ProfileWindow(steps=2, out_dir=Path("unused"), step_index=0)
    window._prof = object()  # started, as far as on_step is concerned
    assert [window.on_step(), window.on_step()] == [False, True]


def test_window_refuses_to_clobber_a_running_profiler(tmp_path):
    window = profiling.ProfileWindow(steps=1, out_dir=tmp_path, step_index=0)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as theirs:
        window.start()
        torch.randn(4, 4).mm(torch.randn(4, 4))
        assert window.on_step() is True
        summary = window.finish()
    assert "already running" in summary["error"] and summary["trace"] is None and summary["top"] == []
    assert any(e.key == "aten::mm" for e in theirs.key_averages())  # the script's profile survived
    assert list(tmp_path.iterdir()) == []


def test_finish_without_start_reports_error(tmp_path):
    summary = profiling.ProfileWindow(steps=1, out_dir=tmp_path, step_index=3).finish()
    assert summary["steps"] == [3, 3] and summary["error"]


def test_window_validates_arguments(tmp_path):
    with pytest.raises(ValueError):
        profiling.ProfileWindow(steps=0, out_dir=tmp_path, step_index=0)
    with pytest.raises(ValueError):
        profiling.ProfileWindow(steps=1, out_dir=tmp_path, step_index=-1)
