"""The overhead benchmark runs end to end and prints its table (no timing is asserted)."""

from __future__ import annotations

import os
import subprocess
import sys

from support.runner import REPO


def test_overhead_benchmark_prints_table_and_verdicts():
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "overhead.py"), "--steps", "1", "--rounds", "1", "--warmup", "1",
         "--pairs", "1", "--pair-steps", "1", "--stall-steps", "2", "--stall-rounds", "1"],
        cwd=REPO, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "| workload | variant | median step (ms) |" in out, out
    for label in ("plain + one `_foreach_norm` (reference)", "ptdash (default hooks)", "naive `.item()` per param",
                  "TensorBoard `add_scalar` per value"):
        assert label in out, out
    assert out.count("| MLP (30 tensors") == 4 and out.count("| GPT (4x256") == 3, out
    assert out.count("| wide (50 Linear(16,16), 100 tensors") == 4, out
    # The real engine recorded every instrumented step: warm-up, block (1 + 1), paired run (1 + 1),
    # the GIL-wait pair of blocks (2 x (1 + 2)).
    assert out.count("the engine recorded 11 steps (expected 11)") == 3, out
    assert out.count("the training thread waiting for the GIL the engine's threads hold:") == 3, out
    assert out.count("paired runs") == 3 and "dashboard stand-in read" in out and "load average" in out, out
    assert out.count("the budget's own measure (StepRecord.own over") == 3, out
    assert "wide, block medians against plain in the same run: ptdash " in out and " tensorboard " in out, out
    verdicts = [line for line in out.splitlines() if line.startswith(("PASS ", "FAIL ", "NOISE "))]
    assert len(verdicts) == 17, out
    for workload in ("mlp", "gpt"):
        # Timed inside the hooks: always decided. One cycle: the paired measures have no interval.
        assert sum(line.startswith(("PASS ", "FAIL ")) and f" {workload}, inside ptdash's hooks:" in line
                   for line in verdicts) == 1, out
        assert sum(line.startswith("NOISE ") and f" {workload}, training thread (paired):" in line
                   for line in verdicts) == 1, out
    assert sum(line.startswith("NOISE ") and " wide, training thread (paired):" in line for line in verdicts) == 1, out
    for workload in ("mlp", "gpt", "wide"):  # one pair of blocks: no interval either
        assert sum(line.startswith("NOISE ") and f" {workload}, training thread + GIL wait (paired):" in line
                   for line in verdicts) == 1, out


def test_overhead_benchmark_reports_the_tiny_step_workloads():
    # A GAN's two optimizers and a loop with no optimizer (inferred steps): reported, no target.
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "overhead.py"), "--workloads", "gan,manual", "--steps", "1",
         "--rounds", "1", "--warmup", "1", "--pairs", "1", "--pair-steps", "1", "--stall-steps", "2",
         "--stall-rounds", "1"],
        cwd=REPO, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert out.count("| GAN (two 3-layer MLPs") == 2 and out.count("| manual SGD (no torch.optim") == 2, out
    # Every instrumented step recorded: 11 for the GAN (as for the other workloads), 10 inferred
    # steps for the manual loop (its last one ends at a backward that never comes).
    assert "gan: done in" in out and "the engine recorded 11 steps (expected 11)" in out, out
    assert "the engine recorded 10 steps (expected 10)" in out, out
    assert out.count("the budget's own measure (StepRecord.own over") == 2, out
    for workload in ("gan", "manual"):
        for what in ("training thread (paired)", "training thread + GIL wait (paired)", "all threads (paired)"):
            assert f"---- {workload}, {what}: ptdash/plain = " in out and "no target" in out, out
    assert not [line for line in out.splitlines() if line.startswith(("PASS ", "FAIL ", "NOISE "))], out
