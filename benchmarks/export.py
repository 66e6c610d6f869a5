"""Exporting a long run: the time and peak memory of ``ptdash export`` on a million steps.

Builds a synthetic finished run (default 1,000,000 steps, the ten series of
``reattach.py``, written through StoreWriter as the engine writes them), then runs the
real command in a subprocess for each format asked and reports its wall time and peak
RSS (``getrusage`` of the child), next to the RSS of the same interpreter doing nothing
but loading the CLI, and the same export of a run a tenth as long: bounded memory means
the two peaks are alike.

    python benchmarks/export.py                          # 1M steps, CSV
    python benchmarks/export.py --steps 100000 --formats csv jsonl tensorboard
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from reattach import build  # noqa: E402  (a sibling script, not a package)


def measure(command: list[str], cwd: Path) -> tuple[float, float]:
    """Wall seconds and peak RSS (MB) of ``command`` run to completion in a fresh child."""
    code = ("import resource, subprocess, sys, time\n"
            "t = time.perf_counter()\n"
            "r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL)\n"
            "dt = time.perf_counter() - t\n"
            "rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024\n"
            "print(r.returncode, dt, rss)")
    out = subprocess.run([sys.executable, "-c", code, *command], cwd=cwd, capture_output=True, text=True, check=True)
    rc, seconds, rss = out.stdout.split()
    if rc != "0":
        raise SystemExit(f"{' '.join(command)} failed with {rc}")
    return float(seconds), float(rss)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=1_000_000)
    p.add_argument("--formats", nargs="+", default=["csv"], choices=("csv", "jsonl", "tensorboard"))
    p.add_argument("--keep", type=Path, help="build the runs here and keep them")
    args = p.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="ptdash-export-"))
    try:
        cli = [sys.executable, "-m", "ptdash.tui.cli"]
        _, idle = measure([*cli, "--version"], root)
        print(f"the CLI loaded, doing nothing: peak RSS {idle:.0f} MB")
        runs = {}
        for steps in (max(1, args.steps // 10), args.steps):
            t = time.perf_counter()
            runs[steps], _ = build(root / f"{steps}", steps)
            print(f"built a run of {steps:,} steps in {time.perf_counter() - t:.0f} s "
                  f"({(runs[steps] / 'metrics.db').stat().st_size / 1e6:.0f} MB store)")
        for fmt in args.formats:
            for steps, run_dir in runs.items():
                out = root / f"out-{steps}.{fmt}"
                seconds, rss = measure([*cli, "export", str(run_dir), "--format", fmt, "-o", str(out)], root)
                size = sum(f.stat().st_size for f in out.rglob("*")) if out.is_dir() else out.stat().st_size
                print(f"export {fmt:<11} {steps:>9,} steps: {seconds:6.1f} s ({steps / seconds:,.0f} steps/s), "
                      f"peak RSS {rss:.0f} MB, {size / 1e6:.0f} MB written")
                shutil.rmtree(out) if out.is_dir() else os.unlink(out)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
