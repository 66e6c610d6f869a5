"""Live controls over the real socket, checked by their effect on the training process."""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import struct
import time

import pytest
import torch

from ptdash.shared import rundir
from ptdash.shared.client import Client
from ptdash.shared.events import read
from ptdash.shared.protocol import Ack, Command, Hello, TransportError
from ptdash.shared.wire import encode
from support.runner import SCRIPTS, Run, ptdash, wait_for

STEADY = SCRIPTS / "steady.py"


@pytest.fixture
def run(tmp_path):
    r = Run(tmp_path, STEADY)
    yield r
    r.close()


def test_pause_stops_the_step_counter_and_resume_restarts_it(run):
    run.wait_step(5)
    ack = run.send("pause")
    assert ack.ok and ack.message == f"paused at step {ack.step}"
    assert run.info().status == "paused"
    run.resume_after_hold(ack, hold=1.0)
    run.wait_step(ack.step + 5)
    assert run.send("resume").message == "not paused"


def test_clip_change_bounds_the_next_grad_norms(tmp_path):
    norms_file = tmp_path / "norms.txt"
    run = Run(tmp_path, STEADY, "--grad-norm-out", str(norms_file))
    try:
        _check_clip(run, norms_file)
    finally:
        run.close()


def _check_clip(run, norms_file):
    run.wait_step(5)
    steps, norms = run.series("grad/norm_total")
    assert max(norms) > 1.0  # the script's gradients are large; the clip below matters
    ack = run.send("clip", 0.5)
    assert ack.ok
    run.wait_step(ack.step + 20)
    run.send("pause")
    # The gradients the script's own update used, as the script measured them.
    used = dict(line.split() for line in norms_file.read_text().splitlines())
    before = [float(v) for s, v in used.items() if int(s) <= ack.step]
    after = [float(v) for s, v in used.items() if int(s) > ack.step]
    assert max(before) > 1.0
    assert len(after) >= 20 and max(after) <= 0.5 * (1 + 1e-5)
    steps, clip_max = run.series("grad/clip_max")
    after = [v for s, v in zip(steps, clip_max) if s > ack.step]
    assert after and all(v == 0.5 for v in after)
    ack_off = run.send("clip", None)
    assert ack_off.ok and ack_off.message.startswith("clip norm 0.5 -> the script's own clipping from step")


def test_engine_refuses_bad_values_even_from_a_raw_client(run):
    for value in (-1.0, 0.0):
        ack = run.send("clip", value)
        assert not ack.ok and "finite number > 0" in ack.message
    ack = run.send("lr_scale", -2.0)
    assert not ack.ok
    ack = run.send("frobnicate")
    assert not ack.ok and "unknown command" in ack.message
    # NaN cannot even be encoded as JSON; a peer that sends it raw gets refused.
    sock = _raw_connect(run)
    payload = b'{"type":"command","v":2,"id":"x","name":"clip","value":NaN}'
    sock.sendall(struct.pack(">I", len(payload)) + payload)
    assert b"refused" in _read_all(sock)
    # Training went on through all of it.
    before = run.last_step()
    run.wait_step(before + 3)


def _raw_connect(run) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(5)
    sock.connect(run.info().socket)
    sock.sendall(encode(Hello(token=rundir.read_token(run.run_dir), client="raw")))
    return sock


def _read_all(sock) -> bytes:
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except socket.timeout:
        pass
    return data


def test_garbage_and_wrong_tokens_are_refused_without_harm(run):
    info = run.info()
    bad = Client(info.socket, "0" * 64, name="intruder")
    with pytest.raises(TransportError, match="wrong token"):
        bad.connect()
    for junk in (b"\x00\x00\x00\x05hello", b"GET / HTTP/1.1\r\n\r\n", b"\xff\xff\xff\xff" + b"x" * 10):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(5)
        sock.connect(info.socket)
        sock.sendall(junk)
        assert b"refused" in _read_all(sock)
        sock.close()
    before = run.last_step()
    run.wait_step(before + 3)
    assert run.send("pause").ok  # the engine still serves its owner


def test_lr_factor_scales_the_effective_lr_and_follows_the_scheduler(run):
    run.wait_step(5)
    ack = run.send("lr_scale", 0.1)
    assert ack.ok
    run.wait_step(ack.step + 10)
    steps, lrs = run.series("opt/lr/group0")
    by_step = dict(zip(steps, lrs))
    for s in range(ack.step + 1, ack.step + 10):
        schedule = 0.05 / (1 + 0.001 * (s - 1))  # the script's LambdaLR value at step s
        assert math.isclose(by_step[s], 0.1 * schedule, rel_tol=1e-9), s
    for s in range(1, ack.step + 1):
        assert math.isclose(by_step[s], 0.05 / (1 + 0.001 * (s - 1)), rel_tol=1e-9), s


def test_checkpoint_loads_into_a_fresh_model(run):
    run.wait_step(5)
    ack = run.send("checkpoint")
    assert ack.ok and "saved" in ack.message
    path = run.run_dir / "checkpoints" / f"step-{ack.step}.pt"
    ckpt = torch.load(path, weights_only=True)
    assert ckpt["ptdash"]["step"] == ack.step
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    model.load_state_dict(ckpt["models"]["Sequential"])
    assert len(ckpt["optimizers"]) == 1 and len(ckpt["schedulers"]) == 1
    assert ckpt["schedulers"][0]["last_epoch"] == ack.step


def test_a_checkpoint_journals_the_command_acknowledged_just_before_it(run):
    # Sent together, the two are applied at the same step boundary: the clip is answered,
    # then the save runs, long before the flusher stores the clip's answer.
    run.wait_step(3)
    clip = Command(id="clip-1", name="clip", value=0.25)
    save = Command(id="save-1", name="checkpoint")
    run.client.send(clip)
    run.client.send(save)
    acks = {}
    while len(acks) < 2:
        msg = run.client.recv(timeout=60)
        assert msg is not None, "no answer"
        if isinstance(msg, Ack) and msg.id in ("clip-1", "save-1"):
            acks[msg.id] = msg
    assert acks["clip-1"].ok and acks["save-1"].ok
    ckpt = torch.load(run.run_dir / "checkpoints" / f"step-{acks['save-1'].step}.pt", weights_only=True)
    journal = ckpt["ptdash"]["journal"]
    (entry,) = [e for e in journal if e["data"]["id"] == "clip-1"]
    assert entry["data"]["value"] == 0.25 and entry["data"]["applied_step"] == acks["clip-1"].step
    assert ckpt["ptdash"]["controls"]["clip"] == 0.25


def test_stop_saves_a_checkpoint_and_runs_finally(run):
    run.wait_step(3)
    ack = run.send("stop")
    assert ack.ok
    assert run.wait() == 0
    assert "finally ran" in run.output()
    assert run.info().status == "stopped"
    assert (run.run_dir / "checkpoints" / f"step-{ack.step}.pt").exists()


def test_pause_requested_during_a_long_step_is_honoured_at_the_next_boundary(tmp_path):
    run = Run(tmp_path, STEADY, "--sleep", "1.5")
    try:
        run.wait_step(1)
        sent = time.time()
        ack = run.send("pause")
        assert ack.ok
        run.resume_after_hold(ack)
        # Honoured at the first boundary after the command came: at most a step that was
        # ending as it was sent lies between (each step takes 1.5 s).
        walls = run.walls()
        assert len([s for s, w in walls.items() if sent < w and s < ack.step]) <= 1
    finally:
        run.close()


def test_resume_equals_an_uninterrupted_run_bit_for_bit(tmp_path):
    n = 40
    straight, first, second = (tmp_path / d for d in ("straight", "first", "second"))
    for d in (straight, first, second):
        d.mkdir()
    ok = ptdash("--headless", "--run-dir", "run", str(STEADY), "--steps", str(2 * n), "--sleep", "0",
                "--params-out", "params.pt", cwd=straight)
    assert ok.returncode == 0, ok.stderr
    ok = ptdash("--headless", "--run-dir", "run", "--checkpoint-every", str(n), str(STEADY),
                "--steps", str(n), "--sleep", "0", cwd=first)
    assert ok.returncode == 0, ok.stderr
    ckpt = first / "run" / "checkpoints" / f"step-{n}.pt"
    assert ckpt.exists()
    ok = ptdash("--headless", "--run-dir", "run", "--resume", str(ckpt), str(STEADY), "--steps", str(2 * n),
                "--sleep", "0", "--params-out", "params.pt", cwd=second)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    a = torch.load(straight / "params.pt")
    b = torch.load(second / "params.pt")
    for key in a:
        assert torch.equal(a[key], b[key]), key
    from ptdash.shared.reader import StoreReader
    with StoreReader(second / "run" / "metrics.db") as s:
        steps, _ = s.series("loss")
    assert steps == list(range(n + 1, 2 * n + 1))


def test_corrupt_and_foreign_checkpoints_are_refused_before_anything_starts(tmp_path):
    (tmp_path / "bad.pt").write_bytes(b"not a checkpoint at all")
    torch.save({"weights": torch.zeros(3)}, tmp_path / "other.pt")
    torch.save({"ptdash": {"version": 1, "step": 5}, "models": {}}, tmp_path / "whole.pt")
    (tmp_path / "cut.pt").write_bytes((tmp_path / "whole.pt").read_bytes()[:200])
    (tmp_path / "ok.py").write_text("print('ran')\n")
    (tmp_path / "dir").mkdir()  # a directory is a sharded checkpoint's (FSDP) only with DCP's .metadata and ptdash.pt
    (tmp_path / "dir" / "ptdash.pt").write_bytes((tmp_path / "whole.pt").read_bytes())
    for name, needle in (("bad.pt", "bad.pt is unreadable"), ("cut.pt", "cut.pt is unreadable"),
                         ("other.pt", "other.pt is not a ptdash checkpoint"),
                         ("dir", "dir is not a ptdash checkpoint: a directory without the .metadata")):
        result = ptdash("--headless", "--run-dir", "run", "--resume", name, "ok.py", cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith("ptdash: error: ") and needle in line
        assert "weights_only" not in line and result.stdout == ""
        assert not (tmp_path / "run").exists()  # nothing was created


def test_a_checkpoint_of_another_model_ends_the_run_before_its_first_step_in_one_line(tmp_path):
    ok = ptdash("--headless", "--run-dir", "first", "--checkpoint-every", "5", str(STEADY), "--steps", "5",
                "--sleep", "0", cwd=tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    ckpt = tmp_path / "first" / "checkpoints" / "step-5.pt"
    result = ptdash("--headless", "--run-dir", "run", "--resume", str(ckpt), str(STEADY), "--steps", "10",
                    "--sleep", "0", "--width", "32", cwd=tmp_path)
    assert result.returncode == 2, result.stdout
    log = (tmp_path / "run" / "output.log").read_text()
    (line,) = [x for x in log.splitlines() if x.startswith("ptdash:")]
    assert line == (f"ptdash: cannot resume from {ckpt}: it does not fit the script's model Sequential: "
                    "0.weight is 16x8 in the checkpoint, 32x8 in the model; "
                    "0.bias is 16 in the checkpoint, 32 in the model; 1 more of other shapes")
    assert "Traceback" not in log and "finally ran" in log  # the script's finally ran, no stack dump
    info = rundir.read_info(tmp_path / "run")
    assert info.status == "crashed" and info.exit_code == 2 and info.detail == line.removeprefix("ptdash: ")
    from ptdash.shared.reader import StoreReader
    with StoreReader(tmp_path / "run" / "metrics.db") as s:
        assert s.last_step() is None  # not one step was taken with the wrong weights


def test_watch_names_the_model_and_periodic_checkpoints_keep_the_last_k(tmp_path):
    result = ptdash("--headless", "--run-dir", "run", "--checkpoint-every", "10", "--keep-last", "2",
                    str(STEADY), "--steps", "55", "--sleep", "0", "--watch", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    kept = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert kept == ["step-40.pt", "step-50.pt"]  # no temp files left either
    ckpt = torch.load(tmp_path / "run" / "checkpoints" / "step-50.pt", weights_only=True)
    assert list(ckpt["models"]) == ["Sequential"] and ckpt["ptdash"]["step"] == 50


def test_ctl_prints_the_ack_and_exits_by_it(tmp_path):
    run = Run(tmp_path, STEADY)
    try:
        run.wait_step(3)
        ok = ptdash("ctl", str(run.run_dir), "lr-scale", "0.5", cwd=tmp_path)
        assert ok.returncode == 0 and "LR factor 1 -> 0.5" in ok.stdout, ok.stderr
        bad = ptdash("ctl", str(run.run_dir), "clip", "-3", cwd=tmp_path)
        assert bad.returncode == 1 and bad.stderr.startswith("ptdash: error: clip norm must be a finite")
        again = ptdash("ctl", str(run.run_dir), "resume", cwd=tmp_path)
        assert again.returncode == 1 and "resume refused: not paused" in again.stdout
        nothing = ptdash("ctl", str(tmp_path / "nope"), "pause", cwd=tmp_path)
        assert nothing.returncode == 1 and "no live run" in nothing.stderr
    finally:
        run.close()


def test_sigkill_during_a_checkpoint_save_leaves_the_previous_one_intact(tmp_path):
    # A wide model makes each save take a while, so the kill lands mid-write.
    run = Run(tmp_path, STEADY, "--width", "3000000", "--sleep", "0")
    ckpts = run.run_dir / "checkpoints"
    try:
        first = run.send("checkpoint", timeout=120)
        assert first.ok
        good = ckpts / f"step-{first.step}.pt"
        reference = torch.load(good, weights_only=True)["models"]["Sequential"]
        run.client.send(Command(id="second", name="checkpoint"))
        tmp = wait_for(lambda: [p for p in ckpts.iterdir() if p.name.endswith(".tmp")], 120, interval=0.005,
                       what="the second save to start writing")
        os.kill(run.info().pid, signal.SIGKILL)
        run.proc.wait(30)
        finals = sorted(p.name for p in ckpts.glob("step-*.pt"))
        assert finals == [good.name], finals  # nothing partial under a final name
        again = torch.load(good, weights_only=True)["models"]["Sequential"]
        for key in reference:
            assert torch.equal(reference[key], again[key])
        assert tmp  # the interrupted write only ever existed as a temp file
    finally:
        run.close()


def test_clip_override_without_script_clipping_keeps_per_layer_norms(tmp_path):
    result = ptdash("--headless", "--run-dir", "run", "--clip", "0.5", str(STEADY), "--steps", "30", "--sleep", "0",
                    cwd=tmp_path)
    assert result.returncode == 0, result.stdout
    from ptdash.shared.reader import StoreReader
    with StoreReader(tmp_path / "run" / "metrics.db") as s:
        layers = s.layers()
        steps, clip = s.series("grad/clip_max")
    assert layers and all(len(record.grad_norms) == 4 for record in layers)
    assert steps == list(range(1, 31)) and set(clip) == {0.5}


STORM_SENDER = """
import json, sys
from pathlib import Path
from ptdash.shared.protocol import Command
from ptdash.tui.ctl import send_command

run_dir, who = Path(sys.argv[1]), sys.argv[2]
plan = [("pause", None), ("pause", None), ("resume", None), ("resume", None), ("clip", 0.5), ("clip", -1.0),
        ("lr_scale", 0.9), ("lr_scale", 1.0), ("clip", None), ("no-such-command", None)]
for n, (name, value) in enumerate(plan):
    ack = send_command(run_dir, Command(id=f"{who}-{n}", name=name, value=value), timeout=120)
    print(json.dumps(None if ack is None else [ack.id, ack.ok, ack.message]), flush=True)
"""


@pytest.mark.slow
def test_a_storm_of_commands_from_twenty_processes_is_answered_and_journaled_once_each(run, tmp_path):
    """200 commands from 20 processes at once, half of them refused (already paused, not paused,
    a bad value, an unknown name): each gets one answer, and each answer is in the journal."""
    run.wait_step(3)
    import subprocess
    import sys

    from support.runner import ENV

    senders = [subprocess.Popen([sys.executable, "-c", STORM_SENDER, str(run.run_dir), f"p{i}"], env=ENV,
                                stdout=subprocess.PIPE, text=True) for i in range(20)]
    answers = []
    for sender in senders:
        out, _ = sender.communicate(timeout=300)
        assert sender.returncode == 0
        answers += [json.loads(line) for line in out.splitlines()]
    assert None not in answers and len(answers) == 200
    assert sorted(a[0] for a in answers) == sorted(f"p{i}-{n}" for i in range(20) for n in range(10))
    refused = [a for a in answers if not a[1]]
    assert len(refused) >= 60  # three of each ten are always refused; the pauses and resumes race
    run.send("resume")  # whichever sender paused last
    run.wait_step(run.last_step() + 2)

    def journaled():
        with run.store() as s:
            found = [read(e) for e in s.events(kind="command")]
        return found if {a.id for a in found} >= {a[0] for a in answers} else None

    journal = {}
    for answer in wait_for(journaled, 120, what="every answer in the journal"):
        journal.setdefault(answer.id, []).append(answer)
    for command_id, ok, _ in answers:
        (entry,) = journal[command_id]  # exactly once
        assert entry.ok is ok
