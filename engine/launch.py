"""``python -m ptdash.launch --nproc-per-node N [--nnodes N --node-rank K --master-addr A
--master-port P] -- TARGET...``: start this node's instrumented ranks through PyTorch's own
elastic launcher (what ``torchrun`` uses) and record how they ended.

``ptdash --nproc-per-node N train.py`` runs this in the background engine session, on each
node of a job of several (where a user puts ``torchrun``). The nodes form the job through
torch's static rendezvous at A:P (node K runs ranks K*N to K*N+N-1, node 0 hosts the store
and rank 0, whose engine is the hub). On node 0 the run dir is the run's; on another node
it is that node's own dir, and its ranks' output goes to the hub (noderelay.py). When a
rank fails, the launcher stops the others; this module names the failed rank and its exit
code in run.json and the run's events (with the node that was lost, if one was), and exits
with that code.
"""

from __future__ import annotations

import argparse
import os
import socket
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
    parser.add_argument("--nnodes", type=int, default=1)
    parser.add_argument("--node-rank", type=int, default=0)
    parser.add_argument("--master-addr", default="127.0.0.1")
    parser.add_argument("--master-port", type=int, default=29500)
    parser.add_argument("--rdzv-id", default="none")
    parser.add_argument("target", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    target = args.target[1:] if args.target[:1] == ["--"] else args.target

    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if args.nnodes > 1:
        config = LaunchConfig(
            min_nodes=args.nnodes, max_nodes=args.nnodes, nproc_per_node=args.nproc_per_node, run_id=args.rdzv_id,
            rdzv_backend="static", rdzv_endpoint=f"{args.master_addr}:{args.master_port}",
            rdzv_configs={"rank": args.node_rank}, max_restarts=0, monitor_interval=0.1)
        os.environ["PTDASH_NNODES"] = str(args.nnodes)
    else:
        config = LaunchConfig(
            min_nodes=1, max_nodes=1, nproc_per_node=args.nproc_per_node, run_id=uuid.uuid4().hex[:8],
            rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0, monitor_interval=0.1)
    run_dir = Path(os.environ["PTDASH_RUN_DIR"])
    os.environ["PTDASH_LAUNCHER_PID"] = str(os.getpid())  # the ranks die with this process
    relay = _node_relay(args, run_dir) if args.nnodes > 1 and args.node_rank > 0 else None
    code = _launch(elastic_launch(config, sys.executable), target, run_dir, ChildFailedError,
                   record=args.node_rank == 0)
    if relay is not None:
        relay.close(code)
    return code


def _node_relay(args, node_dir: Path):
    """On a node other than the hub's: its ranks' output to the hub (None without a key: said why)."""
    from .noderelay import NodeRelay
    from .nodes import link_port
    from .shared.linkkey import LinkKeyError, load_key
    from .shared.rundir import read_info

    first = args.node_rank * args.nproc_per_node
    ranks = f"ranks {first}-{first + args.nproc_per_node - 1}" if args.nproc_per_node > 1 else f"rank {first}"
    try:
        key = load_key()
    except LinkKeyError as exc:
        print(f"ptdash: node {args.node_rank}'s output does not reach the run: {exc}", file=sys.stderr, flush=True)
        return None
    hello = {"host": socket.gethostname(), "node": args.node_rank, "job": args.rdzv_id,
             "config": read_info(node_dir).config.to_json()}
    return NodeRelay(args.master_addr, link_port(args.master_port), key, hello, node_dir, ranks)


def _launch(launch, target: list[str], run_dir: Path, ChildFailedError, record: bool) -> int:
    """Run the ranks; their exit status. ``record``: this node's run dir is the run's."""
    try:
        launch("-m", "ptdash.bootstrap", *target)
    except ChildFailedError as exc:
        # The first failure is the cause; the launcher then stops the other ranks (SIGTERM).
        first_rank, first = exc.get_first_failure()
        others = sorted(r for r in exc.failures if r != first_rank)
        detail = f"rank {first_rank} {describe_exit(first.exitcode)}" + (
            f"; the launcher then stopped rank{'s' if len(others) > 1 else ''} {', '.join(map(str, others))}"
            if others else "")
        failures = [(first_rank, first.exitcode)] + [(r, exc.failures[r].exitcode) for r in others]
        if record:
            detail = _record_failure(run_dir, detail, failures)
        print(f"ptdash: {detail}", file=sys.stderr, flush=True)
        return first.exitcode if first.exitcode > 0 else 1
    return 0


def _record_failure(run_dir: Path, detail: str, failures: list[tuple[int, int]]) -> str:
    """Write how the run ended; the detail, led by the node that was lost (the cause) if one was."""
    lost = rundir.read_info(run_dir).lost_nodes or []
    if lost:
        detail = "; ".join(f"node {n.get('node')} ({n.get('host')}) was lost" for n in lost if isinstance(n, dict)) \
            + f"; then {detail}"
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
    return detail


if __name__ == "__main__":
    sys.exit(main())
