"""Benchmarks run at a small size in the suite, so they cannot rot."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_the_reattach_benchmark_runs(tmp_path):
    """benchmarks/reattach.py at a small size, so it cannot rot (the 1M-step figures are its own run)."""
    bench = Path(__file__).resolve().parents[2] / "benchmarks" / "reattach.py"
    result = subprocess.run([sys.executable, str(bench), "--steps", "20000", "--keep", str(tmp_path), "--target", "30"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "scalar rows/s" in result.stdout and "dashboard drawn" in result.stdout and "last step 20,000" in result.stdout


def test_the_export_benchmark_runs(tmp_path):
    """benchmarks/export.py at a small size (the 1M-step figures are its own run)."""
    bench = Path(__file__).resolve().parents[2] / "benchmarks" / "export.py"
    result = subprocess.run([sys.executable, str(bench), "--steps", "20000", "--keep", str(tmp_path),
                             "--formats", "csv", "tensorboard"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "export csv" in result.stdout and "20,000 steps" in result.stdout and "peak RSS" in result.stdout
