"""The example scripts and the built-in demo run as plain `python` and learn.

Each test runs a script in a fresh interpreter, exactly as a user would without
ptdash, so these also guard the baseline that engine tests compare against.
"""

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
DEMO = ROOT / "engine" / "demo" / "train.py"
STEP_LINE = re.compile(r"^step (\d+) \| loss ([0-9.]+)", re.MULTILINE)


def run_script(script, *args, timeout=120):
    """Run `script` with `args` in a fresh interpreter; return its stdout, failing on a non-zero exit."""
    # These models are too small to gain from more threads, and on a busy machine idle
    # OpenMP threads spinning for work can make a run several times slower.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, str(script), *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=ROOT)
    assert proc.returncode == 0, f"{script.name} exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    return proc.stdout


def read_losses(path):
    return [float(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("name, steps", [("basic.py", 100), ("grad_accum.py", 40), ("lbfgs.py", 10)])
def test_example_learns(tmp_path, name, steps):
    loss_file = tmp_path / "losses.txt"
    out = run_script(EXAMPLES / name, "--steps", steps, "--loss-file", loss_file)
    losses = read_losses(loss_file)
    assert len(losses) == steps, "one loss per optimizer step"
    # Compare averages over a few steps, since a single mini-batch loss is noisy.
    head, tail = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    assert tail < 0.7 * head, f"{name}: loss went {head:.4f} -> {tail:.4f}"
    printed = STEP_LINE.findall(out)
    assert printed and int(printed[-1][0]) == steps, "the last step is always printed"


def test_basic_is_deterministic(tmp_path):
    # Engine tests rely on this to check that running under ptdash changes no bits.
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    # Two separate interpreters, run side by side to halve the wait.
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda f: run_script(EXAMPLES / "basic.py", "--steps", 20, "--loss-file", f), (a, b)))
    assert a.read_text() == b.read_text()


def test_demo_learns():
    out = run_script(DEMO, "--steps", 150, "--n-layer", 2, "--n-embd", 48, "--block-size", 32,
                     "--batch-size", 16, "--lr", 1e-2, "--log-every", 10, "--eval-every", 150,
                     "--device", "cpu")
    losses = [float(loss) for _, loss in STEP_LINE.findall(out)]
    assert len(losses) == 15
    # A uniform guess over the ~65-character vocabulary costs ln(65) = 4.2 nats; below
    # 2.6 the model has at least learned which characters follow which.
    assert losses[0] > 3.0
    assert min(losses[-3:]) < 2.6, f"demo loss only reached {losses[-3:]}"
    assert re.search(r"^eval step 150 \| val loss [0-9.]+$", out, re.MULTILINE)
    assert re.search(r"^sample \| .{40,}$", out, re.MULTILINE)
