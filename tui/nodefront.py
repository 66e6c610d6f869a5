"""The front of a node other than the hub's: it says what this node is, waits for its
launcher and exits with its status.

The run, its store and its dashboards are on node 0; this node's launcher sends its ranks'
output there and prints where the run is once the hub answers (engine/noderelay.py).
Commands, pause and stop come from the hub, so a first SIGINT or SIGTERM here only says
so (under Slurm, ``scancel`` signals node 0's ptdash too, which stops every rank at one
step); a second kills this node's ranks, as it would on node 0.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from ptdash.shared.exits import shell_status

from .headless import say
from .nodeopts import Nodes


def follow_node(nodes: Nodes, node_dir: Path, proc: subprocess.Popen) -> int:
    """Wait for this node's launcher; its exit status."""
    say(f"[ptdash] node {nodes.node_rank} of {nodes.nnodes}: its ranks report to the hub on {nodes.addr} "
        f"(this node's dir: {node_dir})")
    signals = []

    def on_signal(signum, _frame):
        signals.append(signum)
        if len(signals) == 1:
            say(f"[ptdash] node {nodes.node_rank}'s ranks stop when the run stops: stop it on node 0 "
                f"(ptdash ctl RUN stop there); {signal.Signals(signum).name} again kills them")
        else:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, on_signal)
    while True:
        try:
            return shell_status(proc.wait())
        except InterruptedError:
            continue
