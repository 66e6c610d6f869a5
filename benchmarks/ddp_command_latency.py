"""How long a command takes to reach every rank of a DDP run, at its first steps and later.

Starts two gloo ranks through the real CLI (``--nproc-per-node 2``, the ``mp.spawn``
skeleton, and two nodes of one rank each, whose exchanges cross the authenticated TCP
link: two ``ptdash --nnodes 2`` on this machine, each with a private directory of its
own), sends LR-factor commands over the real socket as soon as both ranks have made
two steps, and again after step 2,000, and prints for each: the wait from sending to the
engine's "applied" answer (median and max) and how many steps went by. Ends with the
engine's own figure for what the exchanges cost per step.

    OMP_NUM_THREADS=1 python benchmarks/ddp_command_latency.py [--commands 5] [--sleep 0.002]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ptdash.shared import rundir
from ptdash.shared.client import Client
from ptdash.shared.protocol import Ack, Command
from ptdash.shared.reader import StoreReader
from ptdash.shared.store import STORE_NAME

SCRIPTS = Path(__file__).resolve().parent.parent / "tests" / "scripts"
LAUNCHERS = {"--nproc-per-node 2": (SCRIPTS / "ddp_train.py", ["--nproc-per-node", "2"]),
             "mp.spawn": (SCRIPTS / "ddp_spawn.py", []),
             "--nnodes 2 (TCP)": (SCRIPTS / "ddp_train.py", ["--nnodes", "2", "--nproc-per-node", "1"])}


def _free_pair() -> int:
    """A port P with P and P + 1 free: the rendezvous and the hub's TCP port."""
    import socket

    for port in range(29700, 30700, 2):
        try:
            for p in (port, port + 1):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", p))
            return port
        except OSError:
            continue
    raise SystemExit("no free ports")


def _last(run_dir: Path) -> tuple[int, int]:
    try:
        with StoreReader(run_dir / STORE_NAME) as s:
            return s.last_step(0) or 0, s.last_step(1) or 0
    except Exception:  # noqa: BLE001 - not written yet
        return 0, 0


def _wait(predicate, timeout: float = 300.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.01)
    raise SystemExit("timed out")


def _ack(client: Client, cmd: Command) -> Ack:
    client.send(cmd)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        msg = client.recv(1.0)
        if isinstance(msg, Ack) and msg.id == cmd.id:
            return msg
    raise SystemExit(f"no answer to {cmd.name}")


def measure(name: str, sleep: float, commands: int) -> None:
    script, options = LAUNCHERS[name]
    tmp = Path(tempfile.mkdtemp(prefix="ptdash-ddp-latency-"))
    run_dir = tmp / "run"
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    env.setdefault("OMP_NUM_THREADS", "1")
    procs, node_opts = [], []
    if "--nnodes" in options:
        node_opts = ["--rdzv-endpoint", f"127.0.0.1:{_free_pair()}"]
        env["XDG_CONFIG_HOME"] = str(tmp / "home")  # the nodes' shared home, for the link key
        (tmp / "node1").mkdir()
        runtime = tempfile.mkdtemp(prefix="ptdash-node1-")  # node 1's own private directory
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "ptdash.tui.cli", "--headless", *options, *node_opts, "--node-rank", "1",
             str(script), "--sleep", str(sleep)], cwd=tmp / "node1", env={**env, "XDG_RUNTIME_DIR": runtime},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
        node_opts.extend(["--node-rank", "0"])
    proc = subprocess.Popen([sys.executable, "-m", "ptdash.tui.cli", "--headless", "--run-dir", str(run_dir), *options,
                             *node_opts, str(script), "--sleep", str(sleep)], cwd=tmp, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    procs.append(proc)
    try:
        _wait(lambda: (run_dir / "run.json").exists() and rundir.read_info(run_dir).status == "running")
        client = Client(rundir.read_info(run_dir).socket, rundir.read_token(run_dir), name="bench")
        client.connect()
        for at in (2, 2000):
            _wait(lambda: min(_last(run_dir)) >= at)
            waits, steps = [], []
            for i in range(commands):
                sent_step, t0 = _last(run_dir)[0], time.perf_counter()
                ack = _ack(client, Command(id=f"b{at}-{i}", name="lr_scale", value=1.0))
                waits.append(time.perf_counter() - t0)
                steps.append(ack.step - sent_step)
            print(f"{name:>20}  from step {at:>5}: applied after median {statistics.median(waits) * 1e3:6.1f} ms, "
                  f"max {max(waits) * 1e3:6.1f} ms; {min(steps)}-{max(steps)} steps after the send")
        _ack(client, Command(id="stop", name="stop"))
        proc.wait(120)
        with StoreReader(run_dir / STORE_NAME) as s:
            cost = [e.message for e in s.events() if e.message.startswith("rank channel:")]
        print(f"{name:>20}  {cost[0] if cost else 'no rank channel figure'}")
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commands", type=int, default=5)
    parser.add_argument("--sleep", type=float, default=0.002, help="seconds each step sleeps (default 0.002)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of every launcher, interleaved")
    parser.add_argument("--launchers", nargs="+", choices=list(LAUNCHERS), default=list(LAUNCHERS))
    args = parser.parse_args()
    for _ in range(args.rounds):
        for name in args.launchers:
            measure(name, args.sleep, args.commands)


if __name__ == "__main__":
    main()
