"""Benchmarks run at a small size in the suite, so they cannot rot."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


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


@pytest.mark.slow
def test_the_hub_scale_benchmark_runs():
    """benchmarks/hub_scale.py with two ranks for a few seconds (its figures are for 8 and 16)."""
    bench = Path(__file__).resolve().parents[2] / "benchmarks" / "hub_scale.py"
    result = subprocess.run([sys.executable, str(bench), "--ranks", "2", "--seconds", "3", "--warmup", "1"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 ranks:" in result.stdout and "us per other rank's step" in result.stdout
    assert "extrapolated to 1,000 ranks" in result.stdout and "rank channel:" in result.stdout


@pytest.mark.slow
def test_the_stacks_cost_benchmark_runs():
    """benchmarks/stacks_cost.py for one short round (its figures are its own, longer run)."""
    bench = Path(__file__).resolve().parents[2] / "benchmarks" / "stacks_cost.py"
    result = subprocess.run([sys.executable, str(bench), "--rounds", "1", "--seconds", "2"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "median ratio" in result.stdout and "a stacks request of both ranks answered in" in result.stdout


def test_the_flight_cost_benchmark_runs():
    """benchmarks/flight_cost.py for one short round (its figures are its own, longer run)."""
    bench = Path(__file__).resolve().parents[2] / "benchmarks" / "flight_cost.py"
    result = subprocess.run([sys.executable, str(bench), "--rounds", "1", "--steps", "20", "--reduces", "300"],
                            capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "DDP step, recorder on / off: median ratio" in result.stdout
    assert "ptdash.flight.read() with the buffer full (2000 entries)" in result.stdout


@pytest.mark.slow
def test_the_printed_output_benchmark_runs():
    """benchmarks/printed_output.py at 2 MB, one round (its figures are for 200 MB)."""
    bench = Path(__file__).resolve().parents[2] / "benchmarks" / "printed_output.py"
    result = subprocess.run([sys.executable, str(bench), "--mb", "2", "--rounds", "1"], capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "throughput ptdash/plain" in result.stdout and "eval_loss values stored" in result.stdout
    assert "the parser's own CPU over the same 2 MB" in result.stdout


def test_the_relay_cost_benchmark_runs():
    """benchmarks/relay_cost.py, short (its figures are its own, longer run)."""
    bench = Path(__file__).resolve().parents[2] / "benchmarks" / "relay_cost.py"
    result = subprocess.run([sys.executable, str(bench), "--rounds", "1", "--steps", "20"], capture_output=True,
                            text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "relay, on a thread: median" in result.stdout and "x file); blocks" in result.stdout


def test_the_judge_cost_benchmark_runs():
    """benchmarks/judge_cost.py, short: it finds this ptdash's judge and times it."""
    bench = Path(__file__).resolve().parents[2] / "benchmarks" / "judge_cost.py"
    result = subprocess.run([sys.executable, str(bench), "--calls", "2000", "--rows", "100", "--repeats", "2"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert out.startswith("judge: ptdash.") and "every step, training thread" in out and "per row, flusher thread" in out
    assert "per step of a lean run (compare + learning): " in out, out


def test_the_rollback_cost_benchmark_runs():
    """benchmarks/rollback_cost.py, short (its figures are its own, longer run)."""
    bench = Path(__file__).resolve().parents[2] / "benchmarks" / "rollback_cost.py"
    result = subprocess.run([sys.executable, str(bench), "--workloads", "wide", "--rounds", "5", "--steps", "2",
                             "--engine-rounds", "2", "--engine-steps", "40"],
                            capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "refresh" in result.stdout and "restore" in result.stdout and "rollback/default per round" in result.stdout
