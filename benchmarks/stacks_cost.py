"""What taking every rank's stacks costs the training: step time with ``ptdash stacks`` every
second against none, in interleaved windows of one run.

Starts two gloo ranks through the real CLI (``--nproc-per-node 2``, tests/scripts/hangs.py
with no hang and no sleep: steps of a few milliseconds, a DDP backward and an all_reduce
each), then alternates windows of ``--seconds``: none, stacks, stacks, none, ... (ABBA, so a
drift of the machine's load falls on both). In a stacks window, every rank's stacks are asked
for over the real control socket once a second, as ``ptdash stacks`` does. The step times are
the engine's own (each step's end wall time in the store, both ranks). Prints each round's
median step time both ways, the ratio, and how long a request took to be answered.

On a loaded machine that ratio is mostly the load's noise, so the script also measures the
bound that does not depend on it: how long one take of this process's stacks holds the GIL
(``StackTaker.take`` on another thread while a training loop runs here, in a gloo group of one
whose flight recorder is full: the take reads it), which is the most a take can cost the
training thread; at one take a second, that time in a second.

    OMP_NUM_THREADS=1 python benchmarks/stacks_cost.py [--rounds 6] [--seconds 6]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from ptdash.shared.reader import StoreReader
from ptdash.shared.store import STORE_NAME
from ptdash.tui.stacks_cli import take_stacks

SCRIPT = Path(__file__).resolve().parent.parent / "tests" / "scripts" / "hangs.py"


def _walls(run_dir: Path, rank: int) -> tuple[list[int], list[float]]:
    with StoreReader(run_dir / STORE_NAME) as s:
        steps, walls = s.walls(rank)
    return list(steps), list(walls)


def _step_times(walls: tuple[list[int], list[float]], t0: float, t1: float) -> list[float]:
    steps, ends = walls
    return [b - a for s0, s1, a, b in zip(steps, steps[1:], ends, ends[1:]) if s1 == s0 + 1 and t0 <= a and b <= t1]


def take_seconds(takes: int = 50) -> list[float]:
    """The CPU time of each ``StackTaker.take`` (the GIL held for it) while a small training loop runs
    on another thread, in a gloo process group of one whose flight recorder (torch's size) is full:
    a take reads it too."""
    import torch
    import torch.distributed as dist

    from ptdash.stacks import StackTaker

    dist.init_process_group("gloo", init_method=f"file://{tempfile.mktemp()}", rank=0, world_size=1)
    stop, steps = threading.Event(), [0]

    def train() -> None:
        model = torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(8)])
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x = torch.randn(16, 32)
        while not stop.is_set():
            opt.zero_grad()
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            dist.all_reduce(loss.detach())  # one recorded collective a step
            steps[0] += 1

    trainer = threading.Thread(target=train, name="trainer")
    trainer.start()
    taker = StackTaker(lambda: 0, lambda: 0)
    taker.training = trainer.ident
    out = []
    try:
        while steps[0] < 2100 and trainer.is_alive():  # the recorder full (torch's 2000 entries)
            time.sleep(0.1)
        assert taker.take()["flight"]["entries"], "the recorder read"
        for _ in range(takes):
            t0 = time.thread_time()  # its own CPU time: what it holds the GIL for, not its waits for it
            taker.take()
            out.append(time.thread_time() - t0)
            time.sleep(0.02)
    finally:
        stop.set()
        trainer.join()
        dist.destroy_process_group()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=6, help="ABBA rounds (each: one window without, one with)")
    p.add_argument("--seconds", type=float, default=6.0, help="length of each window")
    p.add_argument("--every", type=float, default=1.0, help="seconds between stacks requests in a stacks window")
    args = p.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "PYTHONWARNINGS": "ignore",
           "XDG_RUNTIME_DIR": tempfile.mkdtemp(prefix="ptd-bench-")}
    work = Path(tempfile.mkdtemp(prefix="ptdash-stacks-bench-"))
    run_dir = work / "run"
    proc = subprocess.Popen([sys.executable, "-m", "ptdash.tui.cli", "--headless", "--nproc-per-node", "2",
                             "--run-dir", str(run_dir), str(SCRIPT), "--sleep", "0", "--steps", "10000000"],
                            cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    os.environ.update(env)  # the client finds the run's socket under the same runtime dir
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if min(len(_walls(run_dir, r)[0]) for r in (0, 1)) >= 200:
                    break
            except Exception:  # noqa: BLE001 - the store is not there yet
                pass
            time.sleep(0.5)
        else:
            raise SystemExit("the ranks did not make 200 steps in 300 s")
        answers: list[float] = []
        windows: list[tuple[str, float, float]] = []
        for r in range(args.rounds):
            for mode in (("none", "stacks") if r % 2 == 0 else ("stacks", "none")):
                t0 = time.time()
                end = t0 + args.seconds
                while mode == "stacks" and time.time() < end - 0.05:
                    asked = time.perf_counter()
                    ranks = take_stacks(run_dir, timeout=10)
                    answers.append(time.perf_counter() - asked)
                    assert ranks is not None and len(ranks) == 2 and all(x["answered"] for x in ranks), ranks
                    threading.Event().wait(max(0.0, args.every - (time.perf_counter() - asked)))
                time.sleep(max(0.0, end - time.time()))
                windows.append((mode, t0, end))
        time.sleep(1.0)  # the last flushes
        walls = [_walls(run_dir, r) for r in (0, 1)]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    print(f"two gloo ranks, steps of a DDP backward + an all_reduce; windows of {args.seconds:g} s, ABBA; "
          f"stacks every {args.every:g} s in the stacks windows; load average {os.getloadavg()[0]:.1f}")
    ratios = []
    for r in range(args.rounds):
        pair = {}
        for mode, t0, t1 in windows[2 * r:2 * r + 2]:
            times = [t for w in walls for t in _step_times(w, t0, t1)]
            pair[mode] = (statistics.median(times), len(times))
        ratio = pair["stacks"][0] / pair["none"][0]
        ratios.append(ratio)
        print(f"round {r + 1}: none {pair['none'][0] * 1e3:.3f} ms ({pair['none'][1]} steps), stacks "
              f"{pair['stacks'][0] * 1e3:.3f} ms ({pair['stacks'][1]} steps): ratio {ratio:.3f}")
    print(f"step time with stacks every {args.every:g} s / without: median ratio {statistics.median(ratios):.3f} "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f}) over {args.rounds} rounds")
    print(f"a stacks request of both ranks answered in {statistics.median(answers) * 1e3:.1f} ms median, "
          f"{max(answers) * 1e3:.1f} ms max ({len(answers)} requests)")
    takes = take_seconds()
    median = statistics.median(takes)
    print(f"one take of a process's stacks and its flight recorder (a training thread running), its CPU time: "
          f"{median * 1e3:.2f} ms median, "
          f"{max(takes) * 1e3:.2f} ms max ({len(takes)} takes): at one a second, at most {median / args.every:.3%} "
          f"of the training thread's time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
