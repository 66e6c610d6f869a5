"""``python -m ptdash.launch --nproc-per-node N -- TARGET...``: start N instrumented ranks
through PyTorch's own elastic launcher (what ``torchrun`` uses) and record how they ended.

``ptdash --nproc-per-node N train.py`` runs this in the background engine session. When a
rank fails, the launcher stops the others; this module names the failed rank and its exit
code in run.json and the run's events, and exits with that code.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from pathlib import Path

from .shared import rundir
from .shared.exits import describe_exit
from .shared.protocol import Event
from .shared.store import STORE_NAME, StoreWriter


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ptdash.launch")
    parser.add_argument("--nproc-per-node", type=int, required=True)
    parser.add_argument("target", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    target = args.target[1:] if args.target[:1] == ["--"] else args.target

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=args.nproc_per_node, run_id=uuid.uuid4().hex[:8],
        rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0, monitor_interval=0.1)
    run_dir = Path(os.environ["PTDASH_RUN_DIR"])
    os.environ["PTDASH_LAUNCHER_PID"] = str(os.getpid())  # the ranks die with this process
    try:
        elastic_launch(config, sys.executable)("-m", "ptdash.bootstrap", *target)
    except ChildFailedError as exc:
        # The first failure is the cause; the launcher then stops the other ranks (SIGTERM).
        first_rank, first = exc.get_first_failure()
        others = sorted(r for r in exc.failures if r != first_rank)
        detail = f"rank {first_rank} {describe_exit(first.exitcode)}" + (
            f"; the launcher then stopped rank{'s' if len(others) > 1 else ''} {', '.join(map(str, others))}"
            if others else "")
        failures = [(first_rank, first.exitcode)] + [(r, exc.failures[r].exitcode) for r in others]
        _record_failure(run_dir, detail, failures)
        print(f"ptdash: {detail}", file=sys.stderr)
        return first.exitcode if first.exitcode > 0 else 1
    return 0


def _record_failure(run_dir: Path, detail: str, failures: list[tuple[int, int]]) -> None:
    info = rundir.update_info(run_dir, status="crashed", exit_code=failures[0][1], ended=time.time(),
                              rank_failures=[{"rank": r, "exitcode": c} for r, c in failures], detail=detail)
    writer = StoreWriter(run_dir / STORE_NAME)
    try:
        step = info.step or 0
        writer.write(events=[Event(kind="run", step=step, wall=time.time(), message=f"crashed: {detail}",
                                   data={"failures": [{"rank": r, "exitcode": c} for r, c in failures]})])
    finally:
        writer.close()
    rundir.unregister(info.id)


if __name__ == "__main__":
    sys.exit(main())
