"""What the hub costs as ranks are added: its CPU and the store's write rate, with N gloo ranks
of fast steps (a tiny model, no sleep) through the real CLI (``--nproc-per-node N``).

Every rank trains the same model on the same kind of data, so a rank's CPU time is the
training's plus its own engine's; rank 0's process is also the hub (it takes every other
rank's flushes over the rank link, writes them to the store, runs the command exchange).
The hub's own cost is therefore rank 0's CPU time less the median of the others', measured
over the same window after a warm-up; divided by the steps the other ranks made, it is the
hub's cost per remote rank-step, which is what grows with the job. The store's rate is the
scalar rows and bytes (database and WAL) it gained over the window. From both, the cost at
1,000 ranks is extrapolated for a few step rates.

    OMP_NUM_THREADS=1 python benchmarks/hub_scale.py [--ranks 8 16] [--seconds 20]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from ptdash.shared import rundir
from ptdash.shared.client import Client
from ptdash.shared.protocol import Command
from ptdash.shared.reader import StoreReader
from ptdash.shared.store import STORE_NAME

SCRIPT = Path(__file__).resolve().parent.parent / "tests" / "scripts" / "ddp_train.py"
TICK = os.sysconf("SC_CLK_TCK")


def _ranks(cwd: Path) -> dict[int, int]:
    """Rank -> pid of the training processes working in ``cwd``."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{entry}/cwd") != str(cwd):
                continue
            if b"ptdash.bootstrap" not in open(f"/proc/{entry}/cmdline", "rb").read():
                continue
            env = dict(v.split(b"=", 1) for v in open(f"/proc/{entry}/environ", "rb").read().split(b"\0") if b"=" in v)
            found[int(env[b"RANK"])] = int(entry)
        except (OSError, KeyError, ValueError):
            continue
    return found


def _cpu(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _store(run_dir: Path) -> tuple[int, int, dict[int, int]]:
    """(scalar rows, bytes of the database and its WAL, rank -> newest step)."""
    db = run_dir / STORE_NAME
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        rows = conn.execute("SELECT COUNT(*) FROM scalars").fetchone()[0]
        steps = dict(conn.execute("SELECT rank, MAX(step) FROM steps GROUP BY rank").fetchall())
    finally:
        conn.close()
    size = sum(p.stat().st_size for p in (db, db.with_name(db.name + "-wal")) if p.exists())
    return rows, size, steps


def measure(n: int, seconds: float, warmup: float) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix=f"hub-scale-{n}-"))
    run_dir = tmp / "run"
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "PYTHONWARNINGS": "ignore"}
    proc = subprocess.Popen([sys.executable, "-m", "ptdash.tui.cli", "--headless", "--run-dir", str(run_dir),
                             "--nproc-per-node", str(n), str(SCRIPT), "--sleep", "0", "--steps", "100000000"],
                            cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            try:
                steps = _store(run_dir)[2]
                if len(steps) == n and min(steps.values()) >= 5:
                    break
            except (sqlite3.Error, OSError):
                pass
            time.sleep(0.5)
        else:
            raise SystemExit(f"{n} ranks did not start")
        time.sleep(warmup)
        pids = _ranks(tmp)
        cpu0, (rows0, size0, steps0), t0 = {r: _cpu(p) for r, p in pids.items()}, _store(run_dir), time.monotonic()
        time.sleep(seconds)
        cpu1, (rows1, size1, steps1), t1 = {r: _cpu(p) for r, p in pids.items()}, _store(run_dir), time.monotonic()
        client = Client(rundir.read_info(run_dir).socket, rundir.read_token(run_dir), name="bench")
        client.connect()
        client.send(Command(id=uuid.uuid4().hex[:8], name="stop", value=None))
        proc.wait(300)
        client.close()
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in _ranks(tmp).values():
            os.kill(pid, signal.SIGKILL)
    span = t1 - t0
    used = {r: cpu1[r] - cpu0[r] for r in cpu0}
    others = [used[r] for r in used if r != 0]
    remote_steps = sum(steps1.get(r, 0) - steps0.get(r, 0) for r in used if r != 0)
    hub = used[0] - statistics.median(others)
    with StoreReader(run_dir / STORE_NAME) as s:
        channel = [e.message for e in s.events() if e.message.startswith("rank channel:")]
    shutil.rmtree(tmp, ignore_errors=True)
    return {"ranks": n, "span": span, "hub_cpu": hub / span, "rank_cpu": statistics.median(others) / span,
            "steps_per_s": remote_steps / (n - 1) / span, "us_per_rank_step": hub / max(1, remote_steps) * 1e6,
            "rows_per_s": (rows1 - rows0) / span, "bytes_per_s": (size1 - size0) / span,
            "rows_per_rank_step": (rows1 - rows0) / max(1, sum(steps1.get(r, 0) - steps0.get(r, 0) for r in used)),
            "channel": channel[0] if channel else ""}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 16])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    args = parser.parse_args()
    results = [measure(n, args.seconds, args.warmup) for n in args.ranks]
    for r in results:
        print(f"{r['ranks']:>3} ranks: {r['steps_per_s']:.1f} steps/s a rank; hub {r['hub_cpu']:.1%} of a core "
              f"beyond a rank's {r['rank_cpu']:.1%}; {r['us_per_rank_step']:.0f} us per other rank's step; store "
              f"{r['rows_per_s']:,.0f} scalar rows/s ({r['rows_per_rank_step']:.1f} a rank-step), "
              f"{r['bytes_per_s'] / 1024:,.0f} KiB/s")
        if r["channel"]:
            print(f"      {r['channel']}")
    cost = statistics.median(r["us_per_rank_step"] for r in results)
    per_step = statistics.median(r["rows_per_rank_step"] for r in results)
    bytes_per_row = statistics.median(r["bytes_per_s"] / max(1.0, r["rows_per_s"]) for r in results)
    print(f"extrapolated to 1,000 ranks at {cost:.0f} us of hub CPU and {per_step:.1f} rows a rank-step "
          f"({bytes_per_row:.0f} bytes a row):")
    for rate in (1, 10, 100):
        rows = 999 * rate * per_step
        print(f"  {rate:>3} steps/s: hub {999 * rate * cost / 1e6:.2f} cores, store {rows:,.0f} rows/s "
              f"({rows * bytes_per_row / 2 ** 20:,.1f} MiB/s)")


if __name__ == "__main__":
    main()
