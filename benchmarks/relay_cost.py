"""What the output relay costs a step that prints a lot, in one process, blocks interleaved.

printed_output.py runs whole processes, whose steps/s this machine's load moves by a third
from run to run. Here one process takes turns, in blocks of ``--steps`` steps, between:

- ``file``: the step's output written through an unbuffered stream (as PYTHONUNBUFFERED,
  which ptdash sets) straight to a file: no relay;
- ``relay``: the same through ptdash's output relay (engine/output.py: fds 1 and 2 a pipe
  that its copier, a process of its own, engine/outproc.py, copies to output.log), read
  for metrics (engine/printread.py) with the steps marked (engine/outmarks.py), as it is;
- ``relay, on a thread``: the same copier on a thread of this process, as the relay was
  before (and is where the process cannot start): its reads and parse take the GIL.

Each block starts its own relay and closes it (its output copied to the end) before the clock stops.

The step is printed_output.py's: a 4-layer MLP (width 32, batch 16) trained, then a tqdm-like
bar redrawn with a carriage return, a loss line and a 96-line dump (8 KB a step). Medians
of the blocks' microseconds a step, and the ratio to ``file``.

    OMP_NUM_THREADS=1 python benchmarks/relay_cost.py [--rounds 8] [--steps 1500]
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=1500, help="steps a block")
    args = parser.parse_args()

    import torch

    from ptdash import output
    from ptdash.printed import PrintedMetrics
    from ptdash.stepstate import StepState

    say = os.fdopen(os.dup(1), "w", buffering=1)  # this benchmark's own lines, past the relay
    run = tempfile.mkdtemp(prefix="ptd-relay-")
    state = StepState()
    out = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
    err = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), write_through=True)
    sys.stdout, sys.stderr = out, err  # what the marks wrap, as the script's streams
    plain = io.TextIOWrapper(io.FileIO(os.path.join(run, "plain.log"), "w"), write_through=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(4)])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(16, 32), torch.randn(16, 32)
    dump = "".join(f"layer {i} weight mean {0.001 * i:.4f} std {0.98:.3f} shape [32, 32] grads ok\n"
                   for i in range(96))

    def block(to, bar_to, process: bool | None = None) -> float:
        relay = None
        if process is not None:
            relay = output.OutputRelay(run, to_file=True, process=process)
            relay.follow(PrintedMetrics(lambda: state.step, lambda *a, **k: None), state)
            time.sleep(0.3)  # the copier's start is the run's, not its steps'
        t0 = time.perf_counter()
        for _ in range(args.steps):
            state.step += 1
            step = state.step
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            value = 1.0 / step
            bar_to.write(f"\r{step % 100:3d}%|#####     | {step % 100}/100 [00:01<00:02, 310.5it/s, loss={value:.4f}]")
            to.write(f"step {step} | loss {value:.4f} | acc 0.91 | 0.5 ms/step\n" + dump)
            if state.out_dirty:  # the step's boundary, as stepend.py has it
                state.out_mark(step + 1)
        if relay is not None:
            relay.close(timeout=60)
        return (time.perf_counter() - t0) / args.steps * 1e6

    variants = ["file", "relay", "relay, on a thread"]
    per: dict[str, list[float]] = {v: [] for v in variants}
    load = [os.getloadavg()[0]]
    for r in range(args.rounds):
        for variant in variants[r % 3:] + variants[:r % 3]:
            if variant == "file":
                per[variant].append(block(plain, plain))
                continue
            per[variant].append(block(sys.stdout, sys.stderr, process=variant == "relay"))
        load.append(os.getloadavg()[0])
    sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    med = {v: statistics.median(per[v]) for v in variants}
    say.write(f"the 200 MB benchmark's step (8 KB printed), {args.rounds} rounds of {args.steps}-step blocks, "
              f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, load average "
              f"{min(load):.1f}-{max(load):.1f}\n")
    for v in variants:
        say.write(f"{v:>18}: median {med[v]:.0f} us a step ({med[v] / med['file']:.2f}x file); blocks "
                  f"{', '.join(f'{t:.0f}' for t in per[v])}\n")


if __name__ == "__main__":
    main()
