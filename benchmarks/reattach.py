"""Re-attaching to a long run: how fast the dashboard draws a million steps of history.

Builds a synthetic finished run (default 1,000,000 steps, ten series, written through
StoreWriter in flush-sized batches as the engine writes them) and reports:

- the store's write rate (steps/s and scalar rows/s, summary upkeep included),
- the time to read every series decimated, as the dashboard's source does on attach,
- the time until the real dashboard (``make_app(ReplaySource(run_dir))`` driven by
  ``App.run_test``) has drawn all of its charts.

    python benchmarks/reattach.py                    # 1M steps in a temporary dir
    python benchmarks/reattach.py --steps 200000 --keep /tmp/bench-run

The target is under 2 s from start to drawn charts for 1M steps.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

from ptdash.shared import rundir
from ptdash.shared.protocol import Event
from ptdash.shared.reader import StoreReader
from ptdash.shared.store import STORE_NAME, StoreWriter

FLUSH_STEPS = 250
"""Steps per write: four flushes a second of a 1000 steps/s run."""

SYSTEM_EVERY = 1000
"""Steps between system samples (once a second at 1000 steps/s)."""


def synthetic_row(step: int, rng: random.Random, wall: float, total: int) -> list:
    """One step of a plausible run: decaying noisy loss, cosine LR, grad norms with spikes."""
    t = step / total
    loss = 2.3 * math.exp(-5 * t) + 0.1 + rng.gauss(0, 0.03)
    norm = 0.5 + 2.0 * math.exp(-8 * t) + abs(rng.gauss(0, 0.1)) + (6.0 if step % 99991 == 0 else 0.0)
    lr = 3e-4 * 0.5 * (1 + math.cos(math.pi * t))
    step_s = 0.001 + abs(rng.gauss(0, 0.0001))
    return [step, wall, {
        "loss": loss, "loss/micro_batches": 1.0, "opt/lr/group0": lr, "opt/lr/group1": lr / 10,
        "grad/norm_total": norm, "grad/clip_max": 1.0, "grad/clipped": float(norm > 1.0),
        "time/step_s": step_s, "throughput/samples_per_s": 64 / step_s,
    }]


def build(root: Path, steps: int) -> tuple[Path, dict]:
    """A finished run dir under ``root`` holding ``steps`` steps; returns it and write figures."""
    run_dir = rundir.create(root, "reattach-bench", argv=["train.py"])
    rng = random.Random(0)
    start = time.time() - steps * 0.001 - 10
    writer = StoreWriter(run_dir / STORE_NAME)
    writer.set_meta(config={"script": "train.py"})
    rows_written = 0
    t0, cpu0 = time.perf_counter(), time.process_time()
    for first in range(1, steps + 1, FLUSH_STEPS):
        rows = [synthetic_row(s, rng, start + s * 0.001, steps) for s in range(first, min(steps, first + FLUSH_STEPS - 1) + 1)]
        samples = []
        if first // SYSTEM_EVERY != (first + FLUSH_STEPS - 1) // SYSTEM_EVERY:
            samples = [[rows[-1][1], {"host/cpu_pct": 50 + 10 * rng.random(), "host/rss_bytes": 2.1e9}]]
        writer.write(rows=rows, samples=samples)
        rows_written += sum(len(r[2]) for r in rows) + sum(len(r[1]) for r in samples)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    writer.write(events=[Event(kind="run", step=0, wall=start, message="started"),
                         Event(kind="run", step=steps, wall=start + steps * 0.001, message="finished")])
    writer.close()
    rundir.update_info(run_dir, status="finished", exit_code=0, pid=None, started=start,
                       ended=start + steps * 0.001, step=steps)
    figures = {"write_s": seconds, "steps_per_s": steps / seconds, "rows_per_s": rows_written / seconds,
               "cpu_s": cpu, "cpu_steps_per_s": steps / cpu, "store_mb": (run_dir / STORE_NAME).stat().st_size / 1e6}
    return run_dir, figures


def time_reads(run_dir: Path) -> dict:
    """Seconds to read every series decimated, the way the dashboard's sources do."""
    from ptdash.tui.source.history import HISTORY_POINTS, load_history, load_series

    t0 = time.perf_counter()
    history = load_history(run_dir)
    first_screen = time.perf_counter() - t0
    load_series(run_dir, history.pending)
    everything = time.perf_counter() - t0
    with StoreReader(run_dir / STORE_NAME) as reader:
        per_series = {}
        for name in reader.names():
            t = time.perf_counter()
            steps, _ = reader.series(name, max_points=HISTORY_POINTS)
            per_series[name] = (time.perf_counter() - t, len(steps))
    return {"first_screen_s": first_screen, "all_series_s": everything, "per_series": per_series}


async def _drawn(run_dir: Path) -> tuple[float, str]:
    from ptdash.tui.app import make_app
    from ptdash.tui.source.replay import ReplaySource
    from ptdash.tui.widgets.chart_panel import ChartPanel
    from ptdash.tui.widgets.overview import Overview

    t0 = time.perf_counter()
    app = make_app(ReplaySource(run_dir))
    async with app.run_test(size=(120, 36)) as pilot:
        panels = list(app.query_one(Overview).query(ChartPanel))
        # The panels on screen: the printed metrics' shows only for a script that printed some.
        while not (shown := [p for p in panels if p.display]) or \
                not all(p.chart.lines and p.chart.lines[0].steps for p in shown):
            if time.perf_counter() - t0 > 60:
                raise SystemExit("the charts were not drawn within 60 s")
            await pilot.pause(0.01)
        await pilot.pause()  # one refresh: the charts are on screen
        seconds = time.perf_counter() - t0
        last = max(p.chart.lines[0].steps[-1] for p in shown)
        while app.state.connection_note != "replay (read-only)":  # let the replay finish before closing
            await pilot.pause(0.05)
        await pilot.pause(0.5)
    return seconds, f"{len(shown)} charts, last step {last:,}"


def time_dashboard(run_dir: Path) -> tuple[float, str]:
    """Seconds from building the app to every chart drawn (Textual already imported)."""
    return asyncio.run(_drawn(run_dir))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=1_000_000)
    p.add_argument("--keep", type=Path, metavar="DIR", help="build the run under DIR and keep it (reused if there)")
    p.add_argument("--target", type=float, default=2.0, help="seconds allowed until the charts are drawn")
    args = p.parse_args(argv)

    root = args.keep or Path(tempfile.mkdtemp(prefix="ptdash-bench-"))
    existing = sorted(root.glob("*-reattach-bench*/" + STORE_NAME)) if args.keep else []
    try:
        if existing:
            run_dir = existing[-1].parent
            print(f"reusing {run_dir}")
        else:
            print(f"writing {args.steps:,} steps to {root} ...", flush=True)
            run_dir, w = build(root, args.steps)
            print(f"write: {w['write_s']:.1f} s, {w['steps_per_s']:,.0f} steps/s, {w['rows_per_s']:,.0f} "
                  f"scalar rows/s (summary included; {w['cpu_s']:.1f} s of CPU, {w['cpu_steps_per_s']:,.0f} "
                  f"steps per CPU second, in {FLUSH_STEPS}-step flushes); store {w['store_mb']:.0f} MB")
        import ptdash.tui.app  # noqa: F401  (import time is the CLI's, not the re-attach's)

        r = time_reads(run_dir)
        slowest = max(r["per_series"].items(), key=lambda kv: kv[1][0])
        print(f"read, first-screen series: {r['first_screen_s']:.3f} s; every series: {r['all_series_s']:.3f} s "
              f"(slowest {slowest[0]}: {slowest[1][0] * 1000:.1f} ms, {slowest[1][1]} points)")
        seconds, what = time_dashboard(run_dir)
        verdict = "OK" if seconds < args.target else "TOO SLOW"
        print(f"dashboard drawn: {seconds:.3f} s ({what}); target {args.target:.1f} s: {verdict}")
        return 0 if seconds < args.target else 1
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
