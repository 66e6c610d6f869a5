"""Runs nobody watches, through the real CLI: batch-job signals, preemption, a front that
dies, an unanswered pause, a full disk and a killed run.

Every run is a user-shaped script (tests/scripts/realistic/batch_job: argparse, a model
module, a DataLoader, epochs, try/finally) under ``ptdash --headless``; every wait is on
something observable (a step in the store, a process's exit, a file), never a sleep.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ptdash.shared import rundir
from ptdash.shared.reader import StoreReader
from ptdash.shared.store import STORE_NAME
from support.runner import ENV, SCRIPTS, ptdash, wait_for

JOB = SCRIPTS / "realistic" / "batch_job" / "train.py"
CLI = [sys.executable, "-m", "ptdash.tui.cli"]
LONG = ("--epochs", "1000", "--sleep", "0.02")
FINALLY = "finally: cleanup ran after step"
STEPS_FOREVER = ("import time, torch\n"
                 "model = torch.nn.Linear(4, 1)\n"
                 "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                 "for _ in range(1_000_000):\n"
                 "    opt.zero_grad()\n"
                 "    model(torch.randn(8, 4)).sum().backward()\n"
                 "    opt.step()\n"
                 "    time.sleep(0.01)\n")
"""A script's training loop that steps until it is stopped."""


def processes_of(run_dir: Path) -> list[int]:
    """Every live process started for this run (the engine, DataLoader workers...)."""
    needle = f"PTDASH_RUN_DIR={run_dir}".encode()
    pids = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if needle in environ.read_bytes().split(b"\0"):
                pids.append(int(environ.parent.name))
        except OSError:
            continue
    return pids


def stored_step(run_dir: Path) -> int:
    try:
        with StoreReader(run_dir / STORE_NAME) as s:
            return s.last_step() or 0
    except Exception:  # noqa: BLE001 - not made yet
        return 0


def checkpoint_of(run_dir: Path) -> tuple[Path, dict]:
    """The one checkpoint a stop saved, at the step run.json ends on."""
    info = rundir.read_info(run_dir)
    path = run_dir / "checkpoints" / f"step-{info.step}.pt"
    assert path.is_file(), sorted(p.name for p in (run_dir / "checkpoints").glob("*"))
    return path, torch.load(path, weights_only=True)


@pytest.fixture
def started(tmp_path):
    """Start a headless run (``prefix`` wraps the CLI, as ``timeout`` does) and clean up after."""
    procs = []

    def start(*options: str, prefix: tuple = (), stdout=None, args: tuple = LONG, script: Path = JOB) -> subprocess.Popen:
        run_dir = tmp_path / "run"
        out = stdout if stdout is not None else open(tmp_path / "front.out", "wb")
        proc = subprocess.Popen([*prefix, *CLI, "--headless", "--run-dir", str(run_dir), *options, str(script), *args],
                                cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=ENV)
        procs.append(proc)
        proc.run_dir = run_dir
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in processes_of(proc.run_dir):
            os.kill(pid, signal.SIGKILL)


def front_output(tmp_path: Path) -> str:
    return (tmp_path / "front.out").read_text()


def assert_stopped_cleanly(run_dir: Path, text: str) -> None:
    wait_for(lambda: not processes_of(run_dir), 30, what="every process of the run to end")
    info = rundir.read_info(run_dir)
    assert info.status == "stopped" and info.exit_code == 0, info
    _, ckpt = checkpoint_of(run_dir)
    assert ckpt["ptdash"]["reason"] == "stop"
    assert FINALLY in text, text[-2000:]


def test_timeout_sigterm_stops_a_headless_run_cleanly(started, tmp_path):
    # timeout forwards the TERM it gets to the front twice (to it and to its process
    # group): one stop, not a stop and a kill.
    proc = started(prefix=("timeout", "-s", "TERM", "600"))
    wait_for(lambda: stored_step(proc.run_dir) >= 5, 120, what="step 5")
    proc.send_signal(signal.SIGTERM)  # to timeout, as its own deadline would
    assert proc.wait(120) == 0  # the stopped script's status (0), not timeout's 124
    text = front_output(tmp_path)
    assert "SIGTERM: stopping cleanly after this step, with a checkpoint" in text
    assert "killing" not in text
    assert_stopped_cleanly(proc.run_dir, text)


def test_sigterm_to_the_training_process_is_a_clean_stop_with_a_checkpoint(started, tmp_path):
    proc = started()
    wait_for(lambda: stored_step(proc.run_dir) >= 5, 120, what="step 5")
    os.kill(rundir.read_info(proc.run_dir).pid, signal.SIGTERM)  # what preemption sends every process
    assert proc.wait(120) == 0
    text = front_output(tmp_path)
    assert "SIGTERM: stopping cleanly at the next step boundary, with a checkpoint" in text
    assert_stopped_cleanly(proc.run_dir, text)
    path, ckpt = checkpoint_of(proc.run_dir)
    assert all(torch.isfinite(t).all() for t in ckpt["models"]["Regressor"].values())


def test_ctrl_c_with_stdout_piped_into_a_reader_that_dies(started, tmp_path):
    reader = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=open(tmp_path / "reader.out", "wb"))
    proc = started(stdout=reader.stdin)
    reader.stdin.close()  # only the front writes into the pipe now
    wait_for(lambda: stored_step(proc.run_dir) >= 5, 120, what="step 5")
    reader.kill()  # `| cat` (or tee) dies first, as Ctrl-C kills the whole pipeline
    reader.wait()
    proc.send_signal(signal.SIGINT)
    assert proc.wait(120) == 0
    # The front's own prints met a closed pipe; the stop went on. The script's output
    # is all in output.log.
    assert_stopped_cleanly(proc.run_dir, (proc.run_dir / "output.log").read_text())


def test_a_headless_front_killed_without_detaching_stops_its_run(started, tmp_path):
    proc = started()
    wait_for(lambda: stored_step(proc.run_dir) >= 5, 120, what="step 5")
    proc.kill()
    proc.wait()
    wait_for(lambda: rundir.read_info(proc.run_dir).status == "stopped", 120, what="the run to stop")
    assert_stopped_cleanly(proc.run_dir, (proc.run_dir / "output.log").read_text())
    with StoreReader(proc.run_dir / STORE_NAME) as s:
        assert any("headless front went away without detaching" in e.message for e in s.events())


def test_sighup_to_a_headless_front_leaves_the_run_going(started, tmp_path):
    proc = started()
    wait_for(lambda: stored_step(proc.run_dir) >= 5, 120, what="step 5")
    proc.send_signal(signal.SIGHUP)
    assert proc.wait(60) == 128 + signal.SIGHUP
    assert "training goes on by itself" in front_output(tmp_path)
    step = stored_step(proc.run_dir)
    wait_for(lambda: stored_step(proc.run_dir) >= step + 20, 120, what="training to go on without its front")
    assert rundir.read_info(proc.run_dir).status == "running"
    result = ptdash("ctl", str(proc.run_dir), "stop", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    wait_for(lambda: rundir.read_info(proc.run_dir).status == "stopped", 120, what="the run to stop")
    assert_stopped_cleanly(proc.run_dir, (proc.run_dir / "output.log").read_text())


def test_an_unanswered_anomaly_pause_ends_by_itself_with_finite_parameters(tmp_path):
    result = ptdash("--headless", "--run-dir", "run", "--pause-timeout", "5", str(JOB), "--epochs", "2",
                    "--nan-at", "20", cwd=tmp_path, timeout=300)
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "[ptdash] paused after step 19: non-finite gradient before the update of step 20, first in head.weight" \
        in out, out
    run_dir = (tmp_path / "run").resolve()
    assert f"ptdash ctl {run_dir} resume" in out and f"ptdash ctl {run_dir} stop" in out
    assert "paused for 5 s and nobody resumed it (--pause-timeout)" in out
    assert "finally: cleanup ran after step 20, params finite True" in out
    info = rundir.read_info(run_dir)
    assert info.status == "stopped" and info.step == 19
    _, ckpt = checkpoint_of(run_dir)
    assert all(torch.isfinite(t).all() for t in ckpt["models"]["Regressor"].values())


def test_a_killed_run_exits_137(started, tmp_path):
    proc = started()
    wait_for(lambda: stored_step(proc.run_dir) >= 3, 120, what="step 3")
    result = ptdash("ctl", str(proc.run_dir), "kill", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert proc.wait(60) == 137
    assert "killed by SIGKILL" in front_output(tmp_path)
    wait_for(lambda: not processes_of(proc.run_dir), 30, what="the killed run's processes to end")


def test_an_engine_killed_from_outside_exits_137_and_says_so(started, tmp_path):
    proc = started()
    wait_for(lambda: stored_step(proc.run_dir) >= 3, 120, what="step 3")
    os.kill(rundir.read_info(proc.run_dir).pid, signal.SIGKILL)  # the OOM killer, kill -9
    assert proc.wait(60) == 137
    info = rundir.read_info(proc.run_dir)
    assert info.status == "crashed" and info.exit_code == -9 and info.detail == "the engine was killed by SIGKILL"


def test_a_second_ctrl_c_kills(started, tmp_path):
    # The script waits between steps for a file that never comes: the first Ctrl-C's stop
    # waits for a step boundary, so the second finds the run still going.
    proc = started(args=("--epochs", "1000", "--wait-for", str(tmp_path / "never"), "--wait-at", "5"))
    wait_for(lambda: stored_step(proc.run_dir) >= 4, 120, what="step 4")
    proc.send_signal(signal.SIGINT)
    wait_for(lambda: "stopping cleanly" in front_output(tmp_path), 60, what="the first Ctrl-C's line")
    # Again until it dies: a second Ctrl-C within REPEAT_S of the first counts as the same one.
    wait_for(lambda: proc.poll() is not None or proc.send_signal(signal.SIGINT), 60, interval=1.0,
             what="a second Ctrl-C to kill the run")
    assert proc.wait(60) == 137
    assert "SIGINT again: killing the run" in front_output(tmp_path)
    wait_for(lambda: not processes_of(proc.run_dir), 30, what="the killed run's processes to end")


def test_a_second_sigterm_after_the_run_ended_keeps_its_exit_code(started, tmp_path):
    # The run's end is recorded before its process is gone (torch's teardown, workers being
    # joined; here an atexit handler that hangs): a second SIGTERM kills what is left of
    # the process, and the exit code stays the run's own (it read 137).
    script = tmp_path / "linger.py"
    script.write_text("import atexit, time\natexit.register(time.sleep, 600)  # a teardown that hangs\n" + STEPS_FOREVER)
    proc = started(script=script, args=())
    wait_for(lambda: stored_step(proc.run_dir) >= 3, 120, what="step 3")
    proc.send_signal(signal.SIGTERM)
    wait_for(lambda: rundir.read_info(proc.run_dir).status == "stopped", 120, what="the run's recorded end")
    # Again until it is gone (one within REPEAT_S of the first counts as the same one).
    wait_for(lambda: proc.poll() is not None or proc.send_signal(signal.SIGTERM), 60, interval=1.0,
             what="a second SIGTERM to end the lingering process")
    assert proc.wait(60) == 0
    text = front_output(tmp_path)
    assert "SIGTERM again: the run had already ended (stopped, exit code 0)" in text, text[-2000:]
    assert "stopped (exit code 0)" in text
    assert "\n\n[ptdash] SIGTERM" not in text  # no empty line of ptdash's own before its lines
    wait_for(lambda: not processes_of(proc.run_dir), 30, what="the lingering process to end")


def test_a_stop_the_script_answers_with_os_exit_reads_stopped(started, tmp_path):
    # Scripts that must not hang in teardown leave through os._exit, from their handler too.
    script = tmp_path / "hard_stop.py"
    body = "".join("    " + line + "\n" for line in STEPS_FOREVER.splitlines())
    script.write_text("import os\ntry:\n" + body + "except BaseException as exc:\n"
                      "    print('leaving on', type(exc).__name__, flush=True)\n    os._exit(0)\n")
    proc = started(script=script, args=())
    wait_for(lambda: stored_step(proc.run_dir) >= 3, 120, what="step 3")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(120) == 0
    info = rundir.read_info(proc.run_dir)
    assert (info.status, info.exit_code) == ("stopped", 0), info
    assert "leaving on StopTraining" in front_output(tmp_path)
    checkpoint_of(proc.run_dir)
    assert stored_step(proc.run_dir) == info.step


def test_sigterm_between_steps_stops_after_the_grace_period(started, tmp_path, monkeypatch):
    # The script stops stepping (it waits for a file that never comes): after the grace
    # period the engine saves and stops it where it is; its finally block still runs.
    monkeypatch.setitem(ENV, "PTDASH_STOP_GRACE", "2")
    proc = started(args=("--epochs", "1000", "--wait-for", str(tmp_path / "never"), "--wait-at", "5"))
    wait_for(lambda: stored_step(proc.run_dir) >= 4, 120, what="step 4")
    os.kill(rundir.read_info(proc.run_dir).pid, signal.SIGTERM)
    assert proc.wait(120) == 0
    text = front_output(tmp_path)
    assert_stopped_cleanly(proc.run_dir, text)
    assert "finally: cleanup ran after step 4" in text
    with StoreReader(proc.run_dir / STORE_NAME) as s:
        assert any("no step ended within 2 s of SIGTERM: stopping between steps" in e.message for e in s.events())


# ------------------------------------------------------------------- a full disk


@pytest.fixture
def small_disk(tmp_path):
    """A 16 MB tmpfs mounted for this test (root only)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mnt)], capture_output=True,
                            text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip() or result.returncode}")
    yield mnt
    for pid in processes_of(mnt / "run"):
        os.kill(pid, signal.SIGKILL)
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(path: Path) -> int:
    """Write zeros into ``path`` until the filesystem is full; the bytes written."""
    written = 0
    with open(path, "wb", buffering=0) as f:
        chunk = bytes(64 * 1024)
        while True:
            try:
                n = f.write(chunk)
            except OSError:
                chunk = chunk[:len(chunk) // 2]
                if len(chunk) < 512:
                    return written
                continue
            written += n


def test_a_full_disk_never_kills_training(small_disk, tmp_path):
    go = tmp_path / "disk-is-full"
    args = ["--epochs", "8", "--hidden", "512", "--wait-for", str(go), "--wait-at", "25"]
    go.touch()
    plain = subprocess.run([sys.executable, str(JOB), *args], capture_output=True, text=True, env=ENV,
                           timeout=300, cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr
    go.unlink()
    run_dir = small_disk / "run"
    front = subprocess.Popen([*CLI, "--headless", "--run-dir", str(run_dir), "--checkpoint-every", "10", str(JOB),
                              *args], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, env=ENV)
    # The script waits before step 25 until the disk is full: two checkpoints fit, then nothing.
    wait_for(lambda: (run_dir / "checkpoints" / "step-20.pt").exists(), 180, what="the checkpoint of step 20")
    fill(small_disk / "filler")
    go.touch()
    out, _ = front.communicate(timeout=300)
    out = out.decode()
    assert front.returncode == plain.returncode == 0, out[-3000:]
    script_lines = [line for line in out.splitlines() if not line.startswith("[ptdash]") and line]
    assert script_lines == plain.stdout.splitlines()  # every line streamed, as the plain run printed them
    assert out.count("no space left on the run dir's filesystem:") == 1, out
    # output.log keeps every line, or what it could not take is counted (the slices of
    # the run dir's reserve the store gives back on the full disk may take some of it).
    logged = (run_dir / "output.log").read_text().splitlines()
    assert ("of the script's output could not be written to output.log" in out
            or logged == plain.stdout.splitlines()), (out[-2000:], logged[-5:])
    info = rundir.read_info(run_dir)
    assert info.status == "finished" and info.exit_code == 0 and info.step == 256, info
    assert not list((run_dir / "checkpoints").glob(".*.tmp"))  # no half-written save left behind
