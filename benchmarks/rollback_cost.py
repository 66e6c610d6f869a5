"""What ``--on-anomaly rollback`` costs: one snapshot refresh and one restore against the step.

    OMP_NUM_THREADS=1 python benchmarks/rollback_cost.py [--workloads mlp,gpt,wide] [--rounds 30] [--steps 10]

On the ``overhead.py`` workloads, in one process, interleaved: a block of ``--steps`` plain
training steps, then one refresh of the rollback snapshot (``engine/snapshot.py``: gathering
the models', optimizer's and scheduler's state and copying it into the host buffers, what the
step's end does every K steps), round after round; a restore every few rounds. Prints the
medians, the refresh as a multiple of a step, what it comes to per step at K = 10 and 100, the
K the default period picks (half the 1% overhead budget) and the host memory one copy takes.
On a CUDA machine (``--device cuda``) the refresh's host time is what the training thread
spends issuing the copies; the copies themselves run on a side stream (their time until the
event completes is printed too).

Then, with ``--engine-rounds N`` (default 6; 0 skips it), the whole of it through a real
Engine in this process: runs of ``--engine-steps`` steps under the default config and under
``--on-anomaly rollback`` (default period) take turns (ABBA), and the median step time of each
run's second half is compared: rollback / default.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
import warnings
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default="mlp,gpt,wide")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--steps", type=int, default=10, help="plain steps timed between two refreshes")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--engine-rounds", type=int, default=6)
    parser.add_argument("--engine-steps", type=int, default=300)
    parser.add_argument("--engine-workloads", default="mlp,wide", help="the workloads measured through the engine")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    import torch

    sys.path.insert(0, str(Path(__file__).parent))
    from overhead import make_gpt, make_mlp, make_wide

    from ptdash.keeper import BUDGET_SHARE, MIN_EVERY
    from ptdash.snapshot import Snapshot, side_sources

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        print("no CUDA device: skipped")
        return 0
    makers = {"mlp": make_mlp, "gpt": make_gpt, "wide": make_wide}
    print(f"rollback cost, {args.rounds} rounds of {args.steps} steps, device {args.device} "
          f"({'wall time' if cuda else 'the training thread CPU time'}), "
          f"{torch.get_num_threads()} thread(s), load {os.getloadavg()[0]:.1f}")
    for name in args.workloads.split(","):
        w = makers[name](10**6)
        if cuda:
            w.model.cuda()
            w.batches = [(x.cuda(), y.cuda()) for x, y in w.batches]
            w.opt = type(w.opt)(w.model.parameters(), **{k: v for k, v in w.opt.defaults.items()
                                                         if k in ("lr", "betas", "weight_decay")})
        for _ in range(5):
            w.step("plain")
        models, opts = [w.model], [w.opt]
        scheds = [w.sched] if w.sched is not None else []
        snap, stream = Snapshot(), torch.cuda.Stream() if cuda else None
        steps, refreshes, restores, landed = [], [], [], []
        clock = time.perf_counter if cuda else time.thread_time  # on CPU: the training thread's own time
        for r in range(args.rounds):
            if cuda:
                torch.cuda.synchronize()  # the benchmark's own sync, to time the plain steps
            t0 = clock()
            for _ in range(args.steps):
                w.step("plain")
            if cuda:
                torch.cuda.synchronize()
            steps.append((clock() - t0) / args.steps)
            t0 = clock()
            structure, sources = Snapshot.gather(models, opts, scheds, [])
            snap.take(r, structure, sources, stream, side_sources(models, structure, sources) if cuda else None)
            refreshes.append(clock() - t0)
            if cuda:
                snap.done.synchronize()
                landed.append(clock() - t0)
            if r % 5 == 4:
                t0 = clock()
                snap.restore(models, opts, scheds, [])
                if cuda:
                    torch.cuda.synchronize()
                restores.append(clock() - t0)
        step, refresh = statistics.median(steps), statistics.median(refreshes)
        auto = max(MIN_EVERY, math.ceil(refresh / (BUDGET_SHARE * 0.01 * step)))
        print(f"\n{w.title}")
        print(f"  step {step * 1e3:.3f} ms (median), state {snap.nbytes / 1e6:.2f} MB in {len(snap.buffers)} tensors")
        print(f"  refresh {refresh * 1e3:.3f} ms = {refresh / step:.2f} steps; per step at K=10: "
              f"{refresh / (10 * step) * 100:.2f}%, K=100: {refresh / (100 * step) * 100:.3f}%; default K {auto} "
              f"({refresh / (auto * step) * 100:.2f}%)")
        if landed:
            print(f"  copies landed {statistics.median(landed) * 1e3:.3f} ms after the refresh began")
        if restores:
            print(f"  restore {statistics.median(restores) * 1e3:.3f} ms = {statistics.median(restores) / step:.2f} steps")
        if args.engine_rounds and not cuda and name in args.engine_workloads.split(","):
            engine_ratio(w, args.engine_rounds, args.engine_steps)
    return 0


def engine_ratio(w, rounds: int, steps: int) -> None:
    """Step times through a real Engine, the default config against ``--on-anomaly rollback``."""
    import tempfile

    from ptdash.engine import Engine
    from ptdash.shared import rundir
    from ptdash.shared.config import RunConfig

    configs = {"default": RunConfig(), "rollback": RunConfig(on_anomaly="rollback")}
    kept = None
    medians: dict[str, list[float]] = {k: [] for k in configs}
    with tempfile.TemporaryDirectory() as root:
        for r in range(rounds):
            order = list(configs) if r % 2 == 0 else list(configs)[::-1]
            for name in order:
                engine = Engine(rundir.create(Path(root), f"{name}-{r}"), configs[name])
                engine.start()
                try:
                    times = []
                    for _ in range(steps):
                        t0 = time.thread_time()  # the training thread's CPU: the other processes' load counts less
                        w.step("plain")
                        times.append(time.thread_time() - t0)
                    if engine.rollback is not None:
                        kept = engine.rollback.keeper.every
                finally:
                    engine.finish("finished", 0)
                medians[name].append(statistics.median(times[steps // 2:]))
    a, b = statistics.median(medians["default"]), statistics.median(medians["rollback"])
    ratios = sorted(x / y for x, y in zip(medians["rollback"], medians["default"]))
    print(f"  through the engine (training thread CPU): default {a * 1e3:.3f} ms/step, rollback {b * 1e3:.3f} "
          f"ms/step (K {kept}); rollback/default per round: median {statistics.median(ratios):.3f}, "
          f"range {ratios[0]:.3f}-{ratios[-1]:.3f}")


if __name__ == "__main__":
    raise SystemExit(main())
