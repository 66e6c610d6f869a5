"""Latency from a command leaving the dashboard to its "applied at step N" acknowledgement.

Starts a real run through the CLI (headless), connects over the real socket, sends LR
factor changes (applied at the next step boundary) and a pause/resume pair, and prints
median and max round trips for a few step times.

    python benchmarks/command_latency.py [--commands 20]
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

STEADY = Path(__file__).resolve().parent.parent / "tests" / "scripts" / "steady.py"


def measure(step_sleep: float, commands: int) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="ptdash-latency-"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.Popen([sys.executable, "-m", "ptdash.tui.cli", "--headless", "--run-dir", str(tmp / "run"),
                             str(STEADY), "--sleep", str(step_sleep)], cwd=tmp, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if (tmp / "run" / "run.json").exists() and rundir.read_info(tmp / "run").status == "running":
                break
            time.sleep(0.1)
        info = rundir.read_info(tmp / "run")
        client = Client(info.socket, rundir.read_token(tmp / "run"), name="bench")
        client.connect()
        time.sleep(1.0)
        rtts = []
        for i in range(commands):
            cmd = Command(id=f"c{i}", name="lr_scale", value=1.0 + (i % 2) * 0.5)
            t0 = time.perf_counter()
            client.send(cmd)
            while True:
                msg = client.recv(timeout=10)
                if isinstance(msg, Ack) and msg.id == cmd.id:
                    rtts.append(time.perf_counter() - t0)
                    break
            time.sleep(0.05)
        t0 = time.perf_counter()
        client.send(Command(id="p", name="pause"))
        while not (isinstance(m := client.recv(timeout=10), Ack) and m.id == "p"):
            pass
        pause = time.perf_counter() - t0
        client.close()
        return {"sleep": step_sleep, "median": statistics.median(rtts), "max": max(rtts), "pause": pause}
    finally:
        pid = rundir.read_info(tmp / "run").pid if (tmp / "run" / "run.json").exists() else None
        proc.kill()
        if pid and rundir.pid_alive(pid):
            os.kill(pid, signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commands", type=int, default=20)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} (a 2-core box shared with other work is noisy)")
    print("| step time (script's sleep) | command -> ack median | max | pause -> ack |")
    print("|---|---|---|---|")
    for sleep in (0.0, 0.01, 0.1):
        r = measure(sleep, args.commands)
        print(f"| {sleep * 1e3:.0f} ms + compute | {r['median'] * 1e3:.1f} ms | {r['max'] * 1e3:.1f} ms "
              f"| {r['pause'] * 1e3:.1f} ms |")


if __name__ == "__main__":
    main()
