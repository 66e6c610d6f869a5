"""Regenerate the dashboard screenshots from real runs, the Overview from a live one.

    python screenshots/make_screenshots.py            # records the runs it needs (about two minutes)
    python screenshots/make_screenshots.py --out DIR  # writes the SVGs elsewhere

Every run goes through the real CLI (``ptdash --headless``) in a temporary directory:

- the built-in demo, watched live by the dashboard (headless, through Textual's pilot):
  it pauses the run, sets the clip norm to 0.5 and resumes, waits for the engine to
  acknowledge each, and shoots the Overview at 120x36 and 80x24 while the run trains, with
  its footer of controls and the LR schedule ahead (dashboard.svg, dashboard-80x24.svg);
  the demo is then stopped cleanly with ``ptdash ctl RUN stop``;
- ``screenshots/scripts/loader_train.py`` (DataLoader workers, a vanishing and an exploding
  parameter) to its end: the System tab with the workers and the step-time split
  (system.svg) and the Layers tab sorted by grad norm with its flags, the top parameter
  charted (layers.svg);
- ``tests/scripts/doctor/loop_bugs.py`` (planted bugs), copied in as ``train.py``, to its
  crash: the Doctor tab with its findings (doctor.svg);
- ``tests/scripts/six_metrics.py`` (a classifier printing six metrics every 10 steps) to its
  end: the Metrics tab, every series in a grid, what the script printed first (metrics.svg).

Two runs side by side are not shot here: docs/compare.md shows the TUI snapshot test's
picture of them (tests/tui/__snapshots__/test_snapshots/test_compare[120x40].svg).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ptdash.shared import rundir
from ptdash.tui.app import make_app
from ptdash.tui.source.live import LiveSource
from ptdash.tui.source.replay import ReplaySource
from ptdash.tui.widgets.value_dialog import ValueDialog

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PTDASH = [sys.executable, "-m", "ptdash.tui.cli"]

DEMO_ARGS = ["--steps", "1500", "--eval-every", "100"]
"""The demo's own arguments: a schedule long enough to show most of it ahead."""

REPLAY_SHOTS = (
    ("loader", (120, 36), ("3",), "system.svg"),
    ("loader", (120, 36), ("2", "o", "enter"), "layers.svg"),
    ("doctor", (120, 36), ("6",), "doctor.svg"),
    ("six", (120, 36), ("7",), "metrics.svg"),
)
"""(run, terminal size, keys pressed after loading, file name) of the shots of finished runs."""


def start(workdir: Path, name: str, target: list[str]) -> tuple[subprocess.Popen, Path]:
    """Start ``ptdash --headless TARGET`` in ``workdir``; return the process and its run dir."""
    run_dir = workdir / name
    proc = subprocess.Popen([*PTDASH, "--headless", f"--run-dir={run_dir}", *target], cwd=workdir,
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    return proc, run_dir


def finish(proc: subprocess.Popen, timeout: float = 300) -> None:
    try:
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.terminate()


async def wait(pilot, condition, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        await pilot.pause(0.1)


def events_text(app) -> str:
    return "\n".join(line.text for line in app.state.events)


async def live_shots(run_dir: Path, out: Path) -> None:
    """Watch the demo live: pause, clip 0.5, resume, each acknowledged; shoot at two sizes."""
    app = make_app(LiveSource(run_dir))
    async with app.run_test(size=(120, 36)) as pilot:
        await wait(pilot, lambda: app.source.can_control, "the engine")
        await wait(pilot, lambda: (app.state.schedule is not None and app.state.status is not None
                                   and app.state.status.step >= 60), "the schedule ahead")
        await pilot.press("space")
        await wait(pilot, lambda: "pause applied" in events_text(app), "the pause")
        await pilot.press("g")
        await wait(pilot, lambda: isinstance(app.screen, ValueDialog), "the clip dialog")
        await pilot.press(*["backspace"] * 8, "0", "full_stop", "5", "enter")
        await wait(pilot, lambda: "clip norm 0.5 from step" in events_text(app), "the clip change")
        await pilot.press("space")
        await wait(pilot, lambda: "resume applied" in events_text(app), "the resume")
        resumed = app.state.status.step
        await wait(pilot, lambda: app.state.status.step >= resumed + 40 and app.drawn, "steps after the resume")
        (out / "dashboard.svg").write_text(app.export_screenshot(title="ptdash 120x36"))
        print(f"wrote {out / 'dashboard.svg'}")
        await pilot.resize_terminal(80, 24)
        await pilot.pause(0.5)
        await wait(pilot, lambda: app.drawn, "the redraw at 80x24")
        (out / "dashboard-80x24.svg").write_text(app.export_screenshot(title="ptdash 80x24"))
        print(f"wrote {out / 'dashboard-80x24.svg'}")
        app.exit("detach")


async def replay_shot(run_dir: Path, size: tuple[int, int], keys: tuple[str, ...], path: Path) -> None:
    app = make_app(ReplaySource(run_dir))
    async with app.run_test(size=size) as pilot:
        await wait(pilot, lambda: app.state.status is not None and app.state.connection_note == "replay (read-only)"
                   and app.drawn, f"the replay of {run_dir}", timeout=10)
        for key in keys:
            await pilot.press(key)
            await pilot.pause(0.2)
        await pilot.pause(0.6)  # the Layers table updates at most twice a second
        path.write_text(app.export_screenshot(title=f"ptdash {size[0]}x{size[1]}"))
    print(f"wrote {path}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE, help="where to write the SVGs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ptdash-shots-") as tmp:
        work = Path(tmp)
        runs = {}
        # The finished runs first, side by side, then the demo alone, so its speed is its own.
        shutil.copy(REPO / "tests" / "scripts" / "doctor" / "loop_bugs.py", work / "train.py")
        loader, runs["loader"] = start(work, "loader", [str(HERE / "scripts" / "loader_train.py")])
        doctor, runs["doctor"] = start(work, "doctor", ["train.py"])
        six, runs["six"] = start(work, "six", [str(REPO / "tests" / "scripts" / "six_metrics.py"), "--steps", "120"])
        finish(loader)
        finish(doctor)
        finish(six)
        demo, demo_dir = start(work, "demo", ["demo", *DEMO_ARGS])
        try:
            deadline = time.monotonic() + 120
            while not (demo_dir / "run.json").exists() or rundir.read_info(demo_dir).status == "starting":
                if time.monotonic() > deadline or demo.poll() is not None:
                    raise SystemExit("the demo did not start")
                time.sleep(0.2)
            asyncio.run(live_shots(demo_dir, args.out))
        finally:
            subprocess.run([*PTDASH, "ctl", str(demo_dir), "stop"], cwd=work, timeout=120,
                           stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
            finish(demo)
        for run, size, keys, name in REPLAY_SHOTS:
            asyncio.run(replay_shot(runs[run], size, keys, args.out / name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
