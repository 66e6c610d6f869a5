"""What torch's flight recorder costs the training, and what reading it costs a take of the stacks.

ptdash leaves the recorder as torch or the user set it (``TORCH_FR_BUFFER_SIZE``; torch 2.13's
default is 2000 entries). The recorder's size is read once per process, so the A/B is of jobs: one run of this script
starts two-rank gloo jobs one after another, recorder off (``TORCH_FR_BUFFER_SIZE=0``) and on
(``--size``) in ABBA order, so that a drift of the machine's load
falls on both. Each job times, per rank, ``--steps`` DDP steps of a small MLP (a forward, a
backward whose reducer all-reduces one bucket, an SGD step) and ``--reduces`` bare one-element
``all_reduce`` calls (the case where recording one collective weighs most), and, with the
recorder on and its buffer full, the CPU time of ``ptdash.flight.read()`` (what a take adds).
Prints each round's medians, their ratios, and the median ratios over the rounds.

    OMP_NUM_THREADS=1 python benchmarks/flight_cost.py [--rounds 6] [--steps 600] [--reduces 3000] [--size N]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap

JOB = textwrap.dedent("""
    import json, os, statistics, sys, time
    import torch, torch.distributed as dist, torch.multiprocessing as mp
    from torch import nn

    def rank(r, steps, reduces, out):
        dist.init_process_group("gloo", rank=r, world_size=2)
        torch.manual_seed(0)
        model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1)))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x, t = torch.randn(16, 64), torch.ones(1)
        step_times, reduce_times = [], []
        for i in range(steps + 50):
            t0 = time.perf_counter()
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if i >= 50:
                step_times.append(time.perf_counter() - t0)
        for i in range(reduces + 100):
            t0 = time.perf_counter()
            dist.all_reduce(t)
            if i >= 100:
                reduce_times.append(time.perf_counter() - t0)
        reads = []
        if os.environ["TORCH_FR_BUFFER_SIZE"] != "0":
            from ptdash.flight import read
            for _ in range(20):
                c0 = time.thread_time()
                flight = read()
                reads.append(time.thread_time() - c0)
            assert flight.entries, flight
        dist.barrier()
        with open(f"{out}.{r}.part", "w") as f:
            json.dump({"step": statistics.median(step_times), "reduce": statistics.median(reduce_times),
                       "read": statistics.median(reads) if reads else None}, f)
        os.replace(f"{out}.{r}.part", f"{out}.{r}")
        dist.destroy_process_group()

    if __name__ == "__main__":
        mp.spawn(rank, args=(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]), nprocs=2)
""")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job(size: str, steps: int, reduces: int, work: str) -> dict:
    """One two-rank job with the recorder's size ``size``: the ranks' medians, averaged over the two."""
    out = os.path.join(work, f"out-{size}")
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": size, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_port()),
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    env.pop("TORCH_NCCL_TRACE_BUFFER_SIZE", None)
    script = os.path.join(work, "job.py")  # spawned ranks import their main module from a file
    with open(script, "w") as f:
        f.write(JOB)
    for r in (0, 1):
        if os.path.exists(f"{out}.{r}"):
            os.remove(f"{out}.{r}")  # an earlier round's
    done = subprocess.run([sys.executable, script, str(steps), str(reduces), out], env=env, timeout=600)
    written = all(os.path.exists(f"{out}.{r}") for r in (0, 1))
    if done.returncode and not written:
        raise SystemExit(f"the job with the recorder's size {size} failed (exit code {done.returncode}) "
                         "before its ranks wrote their figures")
    if done.returncode:  # gloo's teardown aborts now and then (once in CI: "terminate called without an
        # active exception" after every figure was written); the figures stand
        print(f"(the job with size {size} ended with exit code {done.returncode} after its ranks wrote their figures)")
    ranks = []
    for r in (0, 1):
        with open(f"{out}.{r}") as f:
            ranks.append(json.load(f))
    return {k: (statistics.mean(x[k] for x in ranks) if ranks[0][k] is not None else None) for k in ranks[0]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=6, help="ABBA rounds (each: one job off, one on)")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--reduces", type=int, default=3000)
    p.add_argument("--size", default="2000", help="the recorder's size when on (torch 2.13's default: %(default)s)")
    args = p.parse_args()
    work = tempfile.mkdtemp(prefix="ptdash-flight-bench-")
    steps, reduces, reads = [], [], []
    print(f"two gloo ranks per job, recorder off or {args.size} entries, {args.steps} DDP steps and "
          f"{args.reduces} bare all_reduce each; "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '1')}; load average {os.getloadavg()[0]:.1f}")
    for r in range(args.rounds):
        pair = {}
        for size in (("0", args.size) if r % 2 == 0 else (args.size, "0")):
            pair[size] = job(size, args.steps, args.reduces, work)
        off, on = pair["0"], pair[args.size]
        steps.append(on["step"] / off["step"])
        reduces.append(on["reduce"] / off["reduce"])
        reads.append(on["read"])
        print(f"round {r + 1}: step off {off['step'] * 1e3:.3f} ms, on {on['step'] * 1e3:.3f} ms ({steps[-1]:.3f}); "
              f"all_reduce off {off['reduce'] * 1e6:.1f} µs, on {on['reduce'] * 1e6:.1f} µs ({reduces[-1]:.3f}); "
              f"read {on['read'] * 1e3:.2f} ms")
    print(f"DDP step, recorder on / off: median ratio {statistics.median(steps):.3f} "
          f"(min {min(steps):.3f}, max {max(steps):.3f}) over {args.rounds} rounds")
    print(f"bare all_reduce, on / off: median ratio {statistics.median(reduces):.3f} "
          f"(min {min(reduces):.3f}, max {max(reduces):.3f})")
    print(f"ptdash.flight.read() with the buffer full ({args.size} entries): {statistics.median(reads) * 1e3:.2f} ms CPU "
          f"median, {max(reads) * 1e3:.2f} ms max; load average now {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
