"""The history under a filling disk, through the real CLI on a real 20 MB file system
(issue 41, item 6): checkpoints fill it, then something else takes the rest, and the
store still holds every step; a start with too little space says so in words and leaves
nothing behind. Root only (a tmpfs is mounted), as in CI.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from ptdash.shared import diskspace, rundir
from ptdash.shared.reader import StoreReader
from ptdash.shared.store import STORE_NAME
from support.runner import ENV, SCRIPTS, wait_for

JOB = SCRIPTS / "realistic" / "batch_job" / "train.py"
CLI = [sys.executable, "-m", "ptdash.tui.cli"]
STEPS = 300
ARGS = ("--epochs", "10", "--samples", "960", "--hidden", "512")
"""300 steps (30 a epoch) of a model whose checkpoint is 3.3 MB: five fill most of 20 MB."""


def _pids(run_dir) -> list[int]:
    needle = f"PTDASH_RUN_DIR={run_dir}".encode()
    found = []
    for environ in os.scandir("/proc"):
        if environ.name.isdigit():
            try:
                with open(f"/proc/{environ.name}/environ", "rb") as f:
                    if needle in f.read().split(b"\0"):
                        found.append(int(environ.name))
            except OSError:
                pass
    return found


@pytest.fixture
def disk(tmp_path):
    """A 20 MB tmpfs mounted for this test."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(mnt)], capture_output=True,
                            text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (root only): {result.stderr.strip() or result.returncode}")
    yield mnt
    for pid in _pids(mnt / "run"):
        os.kill(pid, signal.SIGKILL)
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(path) -> None:
    """Write into ``path`` until the file system is full."""
    chunk = bytes(64 * 1024)
    with open(path, "wb", buffering=0) as f:
        while len(chunk) >= 512:
            try:
                f.write(chunk)
            except OSError:
                chunk = chunk[:len(chunk) // 2]


def _stored(run_dir) -> int:
    try:
        with StoreReader(run_dir / STORE_NAME) as s:
            return s.last_step() or 0
    except Exception:  # noqa: BLE001 - not made yet
        return 0


def test_a_filling_disk_loses_no_step_that_fits(disk, tmp_path):
    go = tmp_path / "disk-is-full"
    run_dir = disk / "run"
    front = subprocess.Popen([*CLI, "--headless", "--run-dir", str(run_dir), "--checkpoint-every", "10", str(JOB),
                              *ARGS, "--wait-for", str(go), "--wait-at", "50"], cwd=tmp_path,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=ENV)
    # The checkpoints fill the disk up to what the history needs (the guard keeps it);
    # before step 50 the rest is taken by another writer, to the last byte, and the
    # history of 250 more steps (about 0.7 kB each) has only the run dir's reserve.
    wait_for(lambda: _stored(run_dir) >= 49, 300, what="step 49 in the store")
    _fill(disk / "filler")
    assert diskspace.free_bytes(disk) < 8 * 1024
    go.touch()
    out, _ = front.communicate(timeout=400)
    out = out.decode()
    assert front.returncode == 0, out[-3000:]
    info = rundir.read_info(run_dir)
    assert info.status == "finished" and info.step == STEPS, info
    with StoreReader(run_dir / STORE_NAME) as s:
        steps, losses = s.series("loss")
        assert steps == list(range(1, STEPS + 1)) and None not in losses
        assert s.walls()[0] == list(range(1, STEPS + 1))
        said = [e.message for e in s.events()]
        assert s.damage is None
    assert any("the history is written into the run dir's reserve" in m for m in said), said
    assert "history stored to step" not in out and "not in the run's history" not in out, out[-3000:]
    assert out.count("no space left on the run dir's filesystem:") == 1, out[-3000:]
    assert len(list((run_dir / "checkpoints").glob("step-*.pt"))) >= 4
    assert not (run_dir / diskspace.RESERVE).exists()  # given back at the end


def test_a_start_with_too_little_space_says_so_and_leaves_nothing(disk, tmp_path):
    free = diskspace.free_bytes(disk)
    with open(disk / "filler", "wb") as f:
        os.posix_fallocate(f.fileno(), 0, free - 300 * 1024)
    before = diskspace.free_bytes(disk)
    assert 250 * 1024 <= before <= 350 * 1024
    for where in (["--run-dir", str(disk / "run")], []):  # a named run dir, and the default ptdash-runs/
        result = subprocess.run([*CLI, "--headless", *where, str(JOB), "--epochs", "1"], cwd=disk,
                                capture_output=True, text=True, env=ENV, timeout=120, stdin=subprocess.DEVNULL)
        assert result.returncode == 1, result.stdout + result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "not enough space to start a run in" in lines[0], result.stderr
        assert "kB free on its filesystem, a run needs 3.0 MB to start" in lines[0]
        assert "Errno" not in result.stderr and "Traceback" not in result.stderr
        assert sorted(p.name for p in disk.iterdir()) == ["filler"]  # no run dir, no reserve
        assert diskspace.free_bytes(disk) == before
