"""Record the runs the snapshot tests replay as ones the real engine wrote: ``python tests/tui/record_engine_run.py``
(and ``hang``, ``one-hang``, ``skip``: see record_hang, record_one_hang and record_skip).

Runs ``tests/scripts/ddp_bugs.py`` as ``train.py`` through ``ptdash --headless
--nproc-per-node 2`` (two gloo ranks), stops rank 1's process (SIGSTOP) after step 20 until
the engine names it stalled, lets it go on, and lets the job finish. The run dir's
``run.json``, ``metrics.db`` (checkpointed into one file) and ``output.log`` land in
``tests/tui/runs/ddp-stalled/`` as the engine wrote them, recorded under a fixed path
(RECORD_DIR), so that nothing on screen names a temporary directory. Record again after a
change to what the engine stores, then ``pytest --snapshot-update tests/tui/test_snapshots.py``
and look at the new screens before committing both.
"""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
OUT = HERE / "runs" / "ddp-stalled"
RECORD_DIR = Path("/tmp/ptdash-recording")
"""Where the job runs: the paths the run holds (its script, its run dir) name this, on every machine."""
KEPT = ("run.json", "metrics.db", "output.log")

sys.path.insert(0, str(REPO / "tests"))
from ptdash.shared import events  # noqa: E402
from ptdash.shared.reader import StoreReader  # noqa: E402
from support.runner import ENV, rank_pid, wait_for  # noqa: E402 - after the path it lives on


def _stalls(run_dir: Path) -> list[events.Stall]:
    try:
        with StoreReader(run_dir / "metrics.db") as s:
            return [what for e in s.events() if isinstance(what := events.read(e), events.Stall)]
    except Exception:  # noqa: BLE001 - not there yet
        return []


def _last_step(run_dir: Path, rank: int) -> int:
    try:
        with StoreReader(run_dir / "metrics.db") as s:
            return s.last_step(rank) or 0
    except Exception:  # noqa: BLE001 - not there yet
        return 0


def record() -> None:
    shutil.rmtree(RECORD_DIR, ignore_errors=True)
    RECORD_DIR.mkdir(parents=True)
    shutil.copy(REPO / "tests" / "scripts" / "ddp_bugs.py", RECORD_DIR / "train.py")
    run_dir = RECORD_DIR / "run"
    env = {**ENV, "PYTHONWARNINGS": "default", "TZ": "UTC"}
    front = subprocess.Popen(
        [sys.executable, "-m", "ptdash.tui.cli", "--headless", "--nproc-per-node", "2", "--stall-timeout", "2",
         "--run-dir", str(run_dir), "train.py", "--steps", "80", "--sleep", "0.05"],
        cwd=RECORD_DIR, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: _last_step(run_dir, 1) >= 20, 300, what="rank 1 past step 20")
        rank1 = rank_pid(RECORD_DIR, 1)
        os.kill(rank1, signal.SIGSTOP)
        try:
            wait_for(lambda: any(s.ranks == (1,) for s in _stalls(run_dir)), 120, what="the stall named")
        finally:
            os.kill(rank1, signal.SIGCONT)
        assert front.wait(300) == 0
    finally:
        if front.poll() is None:
            front.kill()
    assert any(s.ended for s in _stalls(run_dir)), "the stall's end"
    _keep(run_dir, OUT)


HANG_OUT = HERE / "runs" / "ddp-hang"


def record_hang() -> None:
    """``python tests/tui/record_engine_run.py hang``: tests/scripts/hangs.py on two gloo ranks, rank 1
    spinning in Python for 12 s at step 20 while rank 0 waits in backward; the stall the engine names
    keeps both ranks' stacks (the Ranks tab's snapshot shows them); then the job finishes."""
    shutil.rmtree(RECORD_DIR, ignore_errors=True)
    RECORD_DIR.mkdir(parents=True)
    shutil.copy(REPO / "tests" / "scripts" / "hangs.py", RECORD_DIR / "train.py")
    run_dir = RECORD_DIR / "run"
    env = {**ENV, "TZ": "UTC"}
    done = subprocess.run(
        [sys.executable, "-m", "ptdash.tui.cli", "--headless", "--nproc-per-node", "2", "--stall-timeout", "3",
         "--run-dir", str(run_dir), "train.py", "--steps", "40", "--sleep", "0.05", "--hang", "python",
         "--at", "20", "--for", "12"],
        cwd=RECORD_DIR, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        timeout=600)
    assert done.returncode == 0
    assert any(s.stacks and s.ranks == (1,) for s in _stalls(run_dir)), "the stall named with its stacks"
    _keep(run_dir, HANG_OUT)


ONE_HANG_OUT = HERE / "runs" / "one-hang"


def record_one_hang() -> None:
    """``python tests/tui/record_engine_run.py one-hang``: tests/scripts/hangs.py in one process, whose
    training thread waits 8 s at step 10 for a lock a thread of its own keeps (``--hang lock``); the
    stall keeps both threads' stacks (the stacks screen's snapshot shows them), its end its whole
    length (the Doctor tab's); then the run finishes."""
    shutil.rmtree(RECORD_DIR, ignore_errors=True)
    RECORD_DIR.mkdir(parents=True)
    shutil.copy(REPO / "tests" / "scripts" / "hangs.py", RECORD_DIR / "train.py")
    run_dir = RECORD_DIR / "run"
    env = {**ENV, "TZ": "UTC"}
    done = subprocess.run(
        [sys.executable, "-m", "ptdash.tui.cli", "--headless", "--stall-timeout", "3", "--run-dir", str(run_dir),
         "train.py", "--steps", "20", "--sleep", "0.05", "--hang", "lock", "--rank", "0", "--at", "10",
         "--for", "8"],
        cwd=RECORD_DIR, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        timeout=600)
    assert done.returncode == 0
    stalls = _stalls(run_dir)
    assert any(s.stacks for s in stalls) and any(s.ended and s.seconds >= 8 for s in stalls), stalls
    _keep(run_dir, ONE_HANG_OUT)


SKIP_OUT = HERE / "runs" / "ddp-skip"


def record_skip() -> None:
    """``python tests/tui/record_engine_run.py skip``: tests/scripts/ddp_skip.py on two gloo ranks,
    rank 1 skipping step 12's backward, so that at the end it waits in the final barrier while rank 0
    waits in its last backward; the stall keeps both ranks' stacks and flight recorders (the Ranks
    tab's snapshot shows the collective they disagree on); gloo's 20 s timeout then ends the job."""
    shutil.rmtree(RECORD_DIR, ignore_errors=True)
    RECORD_DIR.mkdir(parents=True)
    shutil.copy(REPO / "tests" / "scripts" / "ddp_skip.py", RECORD_DIR / "train.py")
    run_dir = RECORD_DIR / "run"
    env = {**ENV, "TZ": "UTC"}
    done = subprocess.run(
        [sys.executable, "-m", "ptdash.tui.cli", "--headless", "--nproc-per-node", "2", "--stall-timeout", "3",
         "--run-dir", str(run_dir), "train.py", "--steps", "20", "--at", "12", "--timeout", "20"],
        cwd=RECORD_DIR, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        timeout=600)
    assert done.returncode != 0
    assert any(s.stacks and all(r.flight.entries for r in s.stacks) for s in _stalls(run_dir)), "the stall's flight"
    _keep(run_dir, SKIP_OUT)


def _keep(run_dir: Path, out: Path) -> None:
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for name in (*KEPT, "metrics.db-wal"):
        if (run_dir / name).exists():
            shutil.copy(run_dir / name, out / name)
    with sqlite3.connect(out / "metrics.db") as db:  # the WAL folded in: one file to commit
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        db.execute("PRAGMA journal_mode=DELETE")
    for extra in ("metrics.db-wal", "metrics.db-shm"):
        (out / extra).unlink(missing_ok=True)
    print(f"recorded {out} ({sum(p.stat().st_size for p in out.iterdir()) / 1e6:.1f} MB) at {time.ctime()}")


if __name__ == "__main__":
    {"hang": record_hang, "one-hang": record_one_hang, "skip": record_skip}.get(sys.argv[1] if sys.argv[1:] else "", record)()
