"""The parts of unattended runs that need no training process: the full-disk notice and
the reserve, the front's link, and the sweep of killed saves' temp files."""

from __future__ import annotations

import errno
import sqlite3
import subprocess
import sys

from ptdash.checkpoint import sweep_runs, sweep_temp_files
from ptdash.shared import diskspace, frontlink, rundir


def test_a_full_disk_is_recognised_through_its_causes():
    assert diskspace.is_full(OSError(errno.ENOSPC, "No space left on device"))
    assert diskspace.is_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert diskspace.is_full(sqlite3.OperationalError("database or disk is full"))
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:
            raise RuntimeError("unexpected pos 64 vs 0") from None  # torch's words for it
    except RuntimeError as exc:
        wrapped = exc
    assert diskspace.is_full(wrapped)  # what it was raised during counts, even when hidden from the traceback
    assert not diskspace.is_full(OSError(errno.EACCES, "Permission denied"))


def test_bytes_read_plainly():
    assert [diskspace.fmt_bytes(n) for n in (17, 2_048, 3_100_000, 5.2e9, None)] == \
        ["17 bytes", "2.0 kB", "3.1 MB", "5.2 GB", "an unknown amount"]


def test_the_full_disk_is_named_once_until_there_is_room_again(tmp_path):
    notice, said = diskspace.Notice(), []
    notice.sinks.append(said.append)
    assert notice.full(tmp_path, "checkpoint needs 5.2 MB")
    assert not notice.full(tmp_path, "output.log cannot be written")
    assert len(said) == 1 and said[0].startswith("no space left on the run dir's filesystem: ")
    assert said[0].endswith(" free, checkpoint needs 5.2 MB")
    notice.room_again("written again")
    assert said[-1] == "written again"
    assert notice.full(tmp_path, "checkpoint needs 5.2 MB") and len(said) == 3


def test_a_failing_sink_never_fails_the_writer(tmp_path):
    notice = diskspace.Notice()
    notice.sinks += [lambda m: 1 / 0, (said := []).append]
    notice.say("hello")
    assert said == ["hello"]


def test_the_reserve_is_kept_until_the_run_has_ended(tmp_path):
    run_dir = rundir.create(tmp_path, "r", exact=True)
    reserve = run_dir / diskspace.RESERVE
    assert reserve.stat().st_size == diskspace.RESERVE_BYTES
    rundir.update_info(run_dir, status="running")
    rundir.update_info(run_dir, status="stopped")  # the journal's state change: not the last write
    assert reserve.exists()
    rundir.update_info(run_dir, status="stopped", exit_code=0, ended=1.0)
    assert not reserve.exists()
    assert not list(run_dir.glob(".run.json.*"))


def test_the_link_carries_frames_and_the_fronts_death(tmp_path):
    front_sock, engine_sock = frontlink.pair()
    engine, front = frontlink.EngineLink(engine_sock), frontlink.FrontLink(front_sock)
    engine.output(b"step 1\n")
    engine.notice("no space left on the run dir's filesystem: 0 bytes free, checkpoint needs 3.5 MB")
    engine.flush()
    frames = []
    while len(frames) < 2:
        frames += front.frames()
    assert frames == [(frontlink.OUTPUT, b"step 1\n"),
                      (frontlink.NOTICE, b"no space left on the run dir's filesystem: 0 bytes free, "
                                         b"checkpoint needs 3.5 MB")]
    assert engine.watch(0.0) is None
    front_sock.close()  # the front died
    assert engine.watch(5.0) == "lost"
    engine.output(b"nobody reads this")  # never raises, never blocks
    engine.close()


def test_a_detaching_front_is_not_a_lost_one():
    front_sock, engine_sock = frontlink.pair()
    engine = frontlink.EngineLink(engine_sock)
    frontlink.FrontLink(front_sock).detach()
    front_sock.close()
    assert engine.watch(5.0) == "detached"
    engine.close()


def test_a_front_that_does_not_read_costs_the_engine_a_bounded_buffer(monkeypatch):
    monkeypatch.setattr(frontlink, "BUFFER_BYTES", 1 << 20)
    front_sock, engine_sock = frontlink.pair()
    engine = frontlink.EngineLink(engine_sock)
    for _ in range(64):
        engine.output(bytes(256 * 1024))  # 16 MB to a front that never reads
    assert engine.dropped > 0
    front_sock.close()
    engine.close()


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_killed_saves_temp_files_are_swept_in_the_run_and_its_siblings(tmp_path):
    this, other = rundir.create(tmp_path, "this", exact=True), rundir.create(tmp_path, "other", exact=True)
    dead = dead_pid()
    for run in (this, other):
        (run / "checkpoints").mkdir()
        (run / "checkpoints" / f".step-7.pt.{dead}.tmp").write_bytes(b"half a checkpoint")
        (run / "checkpoints" / ".step-8.pt.1.tmp").write_bytes(b"pid 1 is alive: its save may be running")
        (run / "checkpoints" / "step-6.pt").write_bytes(b"a checkpoint")
    removed = sweep_runs(this)
    assert sorted(p.parent.parent.name for p in removed) == ["other", "this"]
    for run in (this, other):
        assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [".step-8.pt.1.tmp", "step-6.pt"]
    assert sweep_temp_files(tmp_path / "missing") == []


def test_pause_timeout_durations():
    import argparse

    import pytest

    from ptdash.tui.options import duration_arg as _duration_arg

    assert [_duration_arg(t) for t in ("5", "90s", "30m", "2h", "1.5", "none", "off")] == \
        [5.0, 90.0, 1800.0, 7200.0, 1.5, 0.0, 0.0]
    for bad in ("", "-5", "0", "abc", "5x", "nan", "inf"):
        with pytest.raises(argparse.ArgumentTypeError, match="takes a duration like 90, 30m or 2h"):
            _duration_arg(bad)


def test_a_command_without_any_terminal_has_none(tmp_path):
    code = "from ptdash.tui.options import has_terminal; print(has_terminal())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, stdin=subprocess.DEVNULL,
                         start_new_session=True, check=True)  # its own session: no controlling terminal
    assert out.stdout.split() == ["False"]
