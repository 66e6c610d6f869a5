"""The headless front: the script's output, a progress line every few seconds, the exit code.

What ``ptdash`` does when stdout is not a terminal (CI, a batch job, ``| tee``) or with
``--headless``: it copies output.log to stdout, prints a progress line read from the
store, and turns Ctrl-C into a clean stop (a second one kills).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from contextlib import nullcontext
from pathlib import Path

from ptdash.shared import rundir
from ptdash.shared.config import RunInfo
from ptdash.shared.exits import describe_exit
from ptdash.shared.protocol import Command, TransportError
from ptdash.shared.reader import StoreReader, wait_for_store
from ptdash.shared.store import STORE_NAME

from .ctl import send_command
from .fmt import eta, fmt_duration
from .series import StepRate


def headless(run_dir: Path, proc: subprocess.Popen, every: float = 5.0) -> int:
    """Stream the script's output, print a progress line every ``every`` s, return its exit code.

    Ctrl-C asks the engine to stop cleanly; a second Ctrl-C kills it.
    """
    interrupts = 0

    def on_sigint(*_):
        nonlocal interrupts
        interrupts += 1
        name = "stop" if interrupts == 1 else "kill"
        print(f"\n[ptdash] {'stopping cleanly (Ctrl-C again to kill)' if name == 'stop' else 'killing'}",
              flush=True)
        try:
            send_command(run_dir, Command(id=uuid.uuid4().hex[:8], name=name), wait=False)
        except (TransportError, OSError):
            proc.kill()

    previous = signal.signal(signal.SIGINT, on_sigint)
    log_path = run_dir / "output.log"
    offset, last_progress = 0, time.monotonic()
    reader = None
    try:
        while True:
            code = proc.poll()
            offset = _copy_new(log_path, offset)
            if code is not None:
                break
            if time.monotonic() - last_progress >= every:
                reader = reader or wait_for_store(run_dir / STORE_NAME, 0)
                if reader is not None:
                    print(progress_line(reader, rundir.read_info(run_dir)), flush=True)
                last_progress = time.monotonic()
            time.sleep(0.2)
    finally:
        signal.signal(signal.SIGINT, previous)
    info = rundir.read_info(run_dir)
    with wait_for_store(run_dir / STORE_NAME, 1) or nullcontext() as reader:
        line = progress_line(reader, info) if reader else ""
    print(f"[ptdash] {info.status} ({describe_exit(code)}); {line.removeprefix('[ptdash] ')}"
          f"\n[ptdash] run dir: {run_dir}", flush=True)
    return code


def _copy_new(path: Path, offset: int) -> int:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return offset
    if data:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    return offset + len(data)


def progress_line(reader: StoreReader, info: RunInfo) -> str:
    """``[ptdash] step 1200/2000 | loss 2.3456 | lr 3.00e-04 | 12.3 steps/s | ETA 1m05s``.

    The rate leaves out the time the run was paused; the total is run.json's, else the
    end of the stored LR schedule.
    """
    step, values = reader.latest()
    if step is None:
        return f"[ptdash] {info.status}: no step yet"
    schedule = reader.schedule()
    total = info.total_steps or info.config.steps or (schedule.end if schedule is not None else None)
    parts = [f"step {step}/{total}" if total else f"step {step}"]
    if values.get("loss") is not None:
        parts.append(f"loss {values['loss']:.4f}")
    if values.get("opt/lr/group0") is not None:
        parts.append(f"lr {values['opt/lr/group0']:.2e}")
    if values.get("grad/norm_total") is not None:
        parts.append(f"grad norm {values['grad/norm_total']:.3g}")
    rate = StepRate(window_s=float("inf"))
    for s, wall in zip(*reader.walls(after_step=step - 50)):
        rate.add(s, wall)
    for event in reader.events(kind="command"):
        if event.data.get("ok") and event.data.get("name") in ("pause", "resume"):
            (rate.pause if event.data["name"] == "pause" else rate.resume)(event.wall)
    per_s = rate.rate()
    if per_s is not None:
        parts.append(f"{per_s:.1f} steps/s")
        left = eta(step, total, per_s)
        if left is not None and info.status == "running":
            parts.append(f"ETA {fmt_duration(left)}")
    return "[ptdash] " + " | ".join(parts)
