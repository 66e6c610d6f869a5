"""Regenerate the dashboard screenshots from a recorded run.

    python screenshots/make_screenshots.py                 # records a ~40 s demo run first
    python screenshots/make_screenshots.py --run-dir RUN   # uses an existing run dir

The dashboard is opened read-only (ReplaySource) on the run, headless, and saved as SVGs:
the Overview at 120x36 and 80x24 (dashboard.svg, dashboard-80x24.svg), the Layers tab
sorted by grad norm with the top parameter charted (layers.svg), the System tab
(system.svg) and the Doctor tab (doctor.svg). The Ranks tab needs a run of several ranks
(``--run-dir`` of one recorded with ``--nproc-per-node``); on such a run it is shot too (ranks.svg).
Recording uses the real CLI: ``ptdash --headless demo`` in a temporary directory,
stopped cleanly with ``ptdash ctl RUN stop`` after ``--seconds``.
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ptdash.shared import rundir
from ptdash.tui.app import make_app
from ptdash.tui.source.replay import ReplaySource

HERE = Path(__file__).resolve().parent
SHOTS = (
    ((120, 36), (), "dashboard.svg"),
    ((80, 24), (), "dashboard-80x24.svg"),
    ((120, 36), ("2", "o", "enter"), "layers.svg"),
    ((120, 36), ("3",), "system.svg"),
    ((120, 36), ("6",), "doctor.svg"),
)
"""(terminal size, keys pressed after loading, file name) of each screenshot."""

RANKS_SHOT = ((120, 36), ("5",), "ranks.svg")
"""Taken only of a run with several ranks (the tab is hidden otherwise)."""


def record_demo(workdir: Path, seconds: float, demo_args: list[str]) -> Path:
    """Run the demo through the real CLI for ``seconds``, stop it cleanly, return its run dir."""
    run_dir = workdir / "demo-run"
    ptdash = [sys.executable, "-m", "ptdash.tui.cli"]
    proc = subprocess.Popen([*ptdash, "--headless", f"--run-dir={run_dir}", "demo", *demo_args], cwd=workdir,
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        time.sleep(seconds)
        subprocess.run([*ptdash, "ctl", str(run_dir), "stop"], cwd=workdir, timeout=120,
                       stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.terminate()
    return run_dir


async def screenshot(run_dir: Path, size: tuple[int, int], keys: tuple[str, ...], path: Path) -> None:
    app = make_app(ReplaySource(run_dir))
    async with app.run_test(size=size) as pilot:
        deadline = time.monotonic() + 10
        while app.state.status is None or app.state.connection_note != "replay (read-only)" or not app.drawn:
            if time.monotonic() > deadline:
                raise SystemExit(f"the dashboard did not load {run_dir}")
            await pilot.pause(0.1)
        for key in keys:
            await pilot.press(key)
            await pilot.pause(0.2)
        await pilot.pause(0.6)  # the Layers table updates at most twice a second
        path.write_text(app.export_screenshot(title=f"ptdash {size[0]}x{size[1]}"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, help="an existing run dir (default: record a demo run)")
    parser.add_argument("--seconds", type=float, default=40.0, help="how long to record the demo")
    parser.add_argument("--demo-args", default="", help="arguments for the demo script, e.g. \"--n-layer 2\"")
    parser.add_argument("--out", type=Path, default=HERE, help="where to write the SVGs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ptdash-shots-") as tmp:
        run_dir = args.run_dir or record_demo(Path(tmp), args.seconds, shlex.split(args.demo_args))
        info = rundir.read_info(run_dir)  # a clear error for a path that is not a run
        shots = SHOTS + ((RANKS_SHOT,) if (info.world_size or 1) > 1 else ())
        for size, keys, name in shots:
            asyncio.run(screenshot(run_dir, size, keys, args.out / name))
            print(f"wrote {args.out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
