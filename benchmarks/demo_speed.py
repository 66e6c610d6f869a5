"""The demo with and without ptdash, and the dashboard's time to first frame.

Runs `python -m ptdash.demo.train` and `ptdash --headless demo` alternately (same
arguments, same thread count) and compares the script's own ms/step figures (medians
over the logged windows after warm-up). Then starts `ptdash demo` in a private tmux server
and times how long the dashboard takes to show its first frame.

    python benchmarks/demo_speed.py [--rounds 3] [--steps 200] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time


def step_ms(output: str, skip: int = 2) -> list[float]:
    """The demo's logged ms/step figures, without the first warm-up windows."""
    return [float(m) for m in re.findall(r"\| (\d+) ms/step", output)][skip:]


def run(command: list[str], env: dict) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run(command, cwd=tmp, env=env, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise SystemExit(f"{command} failed:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    return step_ms(out.stdout)


def first_frame(env: dict) -> float | None:
    if shutil.which("tmux") is None:
        return None
    server = f"ptdash-bench-{os.getpid()}-{time.monotonic_ns()}"
    tmp = tempfile.mkdtemp()
    exports = " ".join(f"{k}={v}" for k, v in env.items() if k in ("OMP_NUM_THREADS", "XDG_RUNTIME_DIR"))
    t0 = time.monotonic()
    subprocess.run(["tmux", "-L", server, "new-session", "-d", "-s", "b", "-x", "120", "-y", "36", "-c", tmp,
                    f"env {exports} {sys.executable} -m ptdash.tui.cli --run-dir run demo --steps 100000"],
                   check=True)
    try:
        while time.monotonic() - t0 < 60:
            screen = subprocess.run(["tmux", "-L", server, "capture-pane", "-p", "-t", "b"],
                                    capture_output=True, text=True).stdout
            if "demo" in screen and "Pause" in screen:
                return time.monotonic() - t0
            time.sleep(0.02)
        return None
    finally:
        subprocess.run(["tmux", "-L", server, "kill-server"], capture_output=True)
        # The engine outlives its terminal by design: end it here.
        run_json = os.path.join(tmp, "run", "run.json")
        deadline = time.monotonic() + 30
        while not os.path.exists(run_json) and time.monotonic() < deadline:
            time.sleep(0.1)
        for _ in range(100):
            pid = json.load(open(run_json)).get("pid") if os.path.exists(run_json) else None
            if pid:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                break
            time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONWARNINGS": "ignore"}
    demo_args = ["--steps", str(args.steps), "--eval-every", "0", "--log-every", "10"]
    plain_cmd = [sys.executable, "-m", "ptdash.demo.train", *demo_args]
    ptdash_cmd = [sys.executable, "-m", "ptdash.tui.cli", "--headless", "demo", *demo_args]
    plain, under = [], []
    for _ in range(args.rounds):
        plain += run(plain_cmd, env)
        under += run(ptdash_cmd, env)
    p, u = statistics.median(plain), statistics.median(under)
    print(f"load average {os.getloadavg()[0]:.1f}; OMP_NUM_THREADS={args.threads}; {args.rounds} interleaved rounds")
    print("| demo | median ms/step | steps/s |")
    print("|---|---|---|")
    print(f"| python (plain) | {p:.1f} | {1000 / p:.1f} |")
    print(f"| ptdash | {u:.1f} | {1000 / u:.1f} |")
    print(f"| ratio | {u / p:.3f} | |")
    frames = [f for f in (first_frame(env) for _ in range(3)) if f is not None]
    if frames:
        print(f"time from `ptdash demo` to the dashboard's first frame: median {statistics.median(frames):.2f} s "
              f"(of {', '.join(f'{f:.2f}' for f in frames)})")


if __name__ == "__main__":
    main()
