"""The options of a job of several nodes, as ``torchrun`` takes them, and the Slurm environment.

``ptdash --nnodes N --node-rank K --nproc-per-node M --rdzv-endpoint HOST:PORT [--rdzv-id ID]``
(or ``--master-addr/--master-port``), one ``ptdash`` per node where ``torchrun`` would be.
Each option not given is read as torchrun reads it, from its ``PET_<NAME>`` variable; then,
inside an ``srun`` step with one task per node, from Slurm: the node count
(``SLURM_STEP_NUM_NODES``), this node's place (``SLURM_NODEID``), the job id as the
rendezvous id, and the step's first host (``SLURM_STEP_NODELIST``) as the rendezvous host.
The nodes form the job through torch's static rendezvous: node K runs ranks K*M..K*M+M-1,
node 0 hosts the store and rank 0, and its ptdash is the hub. Pure, without torch.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass

from .errors import CliError

DEFAULT_PORT = 29500
"""The rendezvous port when none is given (torchrun's ``--master-port`` default)."""


@dataclass(frozen=True)
class Nodes:
    """Where this node stands in the job and how the nodes meet."""

    nnodes: int
    node_rank: int
    addr: str
    """The rendezvous host: node 0, where the store and the hub listen."""
    port: int
    rdzv_id: str
    link_port: int | None
    """The hub's TCP port when given (else the rendezvous port + 1)."""

    @property
    def hub(self) -> bool:
        return self.node_rank == 0

    def launcher_args(self) -> list[str]:
        """The options ptdash's launcher (``python -m ptdash.launch``) takes for them."""
        return ["--nnodes", str(self.nnodes), "--node-rank", str(self.node_rank), "--master-addr", self.addr,
                "--master-port", str(self.port), "--rdzv-id", self.rdzv_id]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """torchrun's options for several nodes."""
    parser.add_argument("--nnodes", metavar="N", help="nodes in the job (one ptdash per node, as torchrun)")
    parser.add_argument("--node-rank", metavar="K", help="this node's place, 0 to N-1; node 0's ptdash is the hub")
    parser.add_argument("--rdzv-endpoint", metavar="HOST:PORT", help="where the nodes meet: node 0's address")
    parser.add_argument("--rdzv-id", metavar="ID", help="the job's id, the same on every node")
    parser.add_argument("--rdzv-backend", metavar="static", help="only static: --node-rank places each node")
    parser.add_argument("--master-addr", metavar="HOST", help="node 0's address (with --master-port)")
    parser.add_argument("--master-port", metavar="PORT", help=f"the rendezvous port (default {DEFAULT_PORT})")
    parser.add_argument("--link-port", metavar="PORT",
                        help="the hub's authenticated TCP port on node 0 (default: the rendezvous port + 1)")


def expand_nodelist(text: str) -> list[str]:
    """Slurm's host list syntax: ``node[01-03,07],gpu5`` -> node01, node02, node03, node07, gpu5."""
    hosts: list[str] = []
    for prefix, ranges, plain in re.findall(r"([^,\[]+)\[([^\]]*)\]|([^,\[\]]+)", text):
        if plain:
            hosts.append(plain)
            continue
        for part in ranges.split(","):
            low, _, high = part.partition("-")
            if not low.isdigit() or (high and not high.isdigit()):
                raise CliError(f"cannot read the Slurm host list {text!r}", 2)
            for n in range(int(low), int(high or low) + 1):
                hosts.append(f"{prefix}{n:0{len(low)}d}")
    return hosts


def _number(value, name: str, low: int = 0) -> int | None:
    if value is None or value == "":
        return None
    try:
        n = int(value)
    except ValueError:
        raise CliError(f"{name} must be a whole number, not {value!r}", 2) from None
    if n < low:
        raise CliError(f"{name} must be at least {low}, not {n}", 2)
    return n


def _slurm(environ) -> dict:
    """What an srun step with one task per node says of the job ({} outside one)."""
    if "SLURM_STEP_ID" not in environ or "SLURM_JOB_ID" not in environ:
        return {}
    nodes = _number(environ.get("SLURM_STEP_NUM_NODES") or environ.get("SLURM_NNODES"), "SLURM_STEP_NUM_NODES", 1)
    tasks = _number(environ.get("SLURM_STEP_NUM_TASKS") or environ.get("SLURM_NTASKS"), "SLURM_STEP_NUM_TASKS", 1)
    if not nodes or nodes < 2:
        return {}
    if tasks is not None and tasks != nodes:
        raise CliError(f"this srun step runs {tasks} tasks on {nodes} nodes: run one ptdash per node "
                       "(srun --ntasks-per-node=1), and --nproc-per-node ranks under each", 2)
    hostlist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST") or ""
    hosts = expand_nodelist(hostlist) if hostlist else []
    return {"nnodes": nodes, "node_rank": environ.get("SLURM_NODEID"), "rdzv_id": environ["SLURM_JOB_ID"],
            "addr": hosts[0] if hosts else None}


def resolve(args: argparse.Namespace, environ) -> Nodes | None:
    """The job's nodes from the options, torchrun's PET_ variables and Slurm; None for one node."""
    def given(name: str):
        value = getattr(args, name)
        return value if value is not None else environ.get(f"PET_{name.upper()}")

    slurm = _slurm(environ) if given("nnodes") is None else {}
    nnodes = _number(given("nnodes"), "--nnodes", 1) or slurm.get("nnodes") or 1
    if nnodes == 1:
        return None
    backend = given("rdzv_backend") or "static"
    if backend != "static":
        raise CliError(f"--rdzv-backend {backend}: ptdash's launcher forms the job with torch's static rendezvous "
                       "(--node-rank places each node); for an elastic one run your own torchrun with "
                       "-m ptdash.bootstrap", 2)
    node_rank = _number(given("node_rank") if given("node_rank") is not None else slurm.get("node_rank"),
                        "--node-rank")
    if node_rank is None:
        raise CliError(f"--nnodes {nnodes} needs --node-rank K (0 on the node that is the hub)", 2)
    if node_rank >= nnodes:
        raise CliError(f"--node-rank {node_rank} is not a node of {nnodes} (0 to {nnodes - 1})", 2)
    endpoint, addr = given("rdzv_endpoint"), given("master_addr")
    port = _number(given("master_port"), "--master-port", 1)
    if endpoint:
        host, colon, text = endpoint.rpartition(":")
        if not colon or not host:
            host, text = endpoint, ""
        addr, port = host.strip("[]"), _number(text, "--rdzv-endpoint's port", 1) or port
    addr = addr or slurm.get("addr")
    if not addr:
        raise CliError(f"--nnodes {nnodes} needs --rdzv-endpoint HOST:PORT (or --master-addr HOST): node 0's "
                       "address, the same on every node", 2)
    link_port = _number(given("link_port"), "--link-port", 1)
    return Nodes(nnodes, node_rank, addr, port or DEFAULT_PORT, given("rdzv_id") or slurm.get("rdzv_id") or "none",
                 link_port)
