"""What ptdash costs a CUDA training loop: plain python against ``ptdash --headless``, whole
processes taking turns (ABBA), each timing its own loop of steps (after a warm-up, the
device synchronized at both ends), so start-up is not counted.

    python benchmarks/gpu_overhead.py [--rounds 4] [--steps 400] [--width 1024] [--clip]

The loop: a GPT-like stack of ``--layers`` Linear+GELU blocks of ``--width`` on the device,
AdamW, a OneCycle schedule, and with ``--clip`` a clip_grad_norm_ each step; nothing is read
back until the end. Prints each round's seconds, the medians and ptdash / plain. Without
CUDA it prints "no CUDA device: skipped" and exits 0.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

LOOP = """\
import sys, time, torch
steps, width, layers, clip = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU())
                              for _ in range(layers)], torch.nn.Linear(width, 1)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-4, total_steps=steps + 50)
x, y = torch.randn(256, width, device="cuda"), torch.randn(256, 1, device="cuda")

def step():
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if clip:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    return loss

for _ in range(50):
    step()
torch.cuda.synchronize()
t0 = time.perf_counter()
for _ in range(steps):
    loss = step()
torch.cuda.synchronize()
print(f"LOOP {time.perf_counter() - t0:.6f} {loss.item():.6g}", flush=True)
"""


def _run(ptdash: bool, script: Path, work: Path, args, index: int) -> tuple[float, str]:
    argv = [str(args.steps), str(args.width), str(args.layers), "1" if args.clip else "0"]
    cmd = ([sys.executable, "-m", "ptdash.tui.cli", "--headless", "--run-dir", str(work / f"run{index}"), str(script)]
           if ptdash else [sys.executable, str(script)])
    done = subprocess.run(cmd + argv, capture_output=True, text=True, cwd=work, timeout=1800,
                          env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
    lines = [line for line in done.stdout.splitlines() if line.startswith("LOOP ")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"{'ptdash' if ptdash else 'plain'} run failed ({done.returncode}): {done.stdout[-2000:]}"
                         f"{done.stderr[-2000:]}")
    seconds, loss = lines[-1].split()[1:]
    return float(seconds), loss


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4, help="ABBA rounds (each: plain, ptdash, ptdash, plain)")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--clip", action="store_true")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: skipped")
        return 0
    print(f"gpu_overhead: {torch.cuda.get_device_name(0)}, {args.steps} steps of width {args.width} x "
          f"{args.layers}{', clipped' if args.clip else ''}, {args.rounds} ABBA rounds, load {os.getloadavg()[0]:.1f}")
    times: dict[bool, list[float]] = {False: [], True: []}
    losses: dict[bool, set[str]] = {False: set(), True: set()}
    with tempfile.TemporaryDirectory(prefix="ptd-gpu-") as tmp:
        work = Path(tmp)
        script = work / "loop.py"
        script.write_text(LOOP)
        index = 0
        for r in range(args.rounds):
            for ptdash in (False, True, True, False):
                seconds, loss = _run(ptdash, script, work, args, index)
                index += 1
                times[ptdash].append(seconds)
                losses[ptdash].add(loss)
            ms = {k: [f"{t * 1e3 / args.steps:.3f}" for t in v[-2:]] for k, v in times.items()}
            ratio = sum(times[True][-2:]) / sum(times[False][-2:])
            print(f"  round {r + 1}: plain {' / '.join(ms[False])} ms a step, ptdash {' / '.join(ms[True])}"
                  f" ({ratio:.3f}x)")
    plain, under = statistics.median(times[False]), statistics.median(times[True])
    print(f"plain: median {plain * 1e3 / args.steps:.3f} ms a step; "
          f"ptdash: median {under * 1e3 / args.steps:.3f} ms a step")
    print(f"ptdash / plain: {under / plain:.3f}x; final losses plain {sorted(losses[False])}, "
          f"ptdash {sorted(losses[True])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
