"""Every command against every kind of script ptdash supports, through the real CLI.

Each cell of docs/controls.md's table is checked by its effect on the training itself:
the script (tests/scripts/kinds.py) writes, for every step, the LR and the gradient norm
its update actually used, measured from the update. A command either visibly takes effect
there (or in a file: a checkpoint, a profile), or it is refused with its reason; none is
acknowledged and ignored. One run per kind of script takes every command in turn.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ptdash.shared.protocol import Status
from support.runner import ENV, SCRIPTS, Run, kill_all, processes_in, wait_for

KINDS = SCRIPTS / "kinds.py"
LR = 0.01
START_SCALE, LIVE_SCALE, CLIP = 0.5, 0.1, 0.05

# kind: (each optimizer's LR as the script sets it at step s, optimizers in a checkpoint,
#        the reason lr-scale is refused, or None where it applies)
NO_OPTIMIZER = "the script sets its own LR (no torch.optim optimizer); ptdash cannot scale it"
CELLS = {
    "one": ((lambda s: LR,), 1, None),
    "several": ((lambda s: LR, lambda s: LR / 2), 2, None),
    "manual": ((lambda s: LR,), 0, NO_OPTIMIZER),
    "closure": ((lambda s: LR,), 1, None),
    "lbfgs": ((lambda s: LR,), 1, None),
    "trainer": ((lambda s: LR * min(1.0, s / 20),), 1, None),
}


def ctl(run: Run, *words: str) -> tuple[int, dict]:
    """``ptdash ctl RUN WORDS --json``: its exit status and the engine's answer."""
    out = subprocess.run([sys.executable, "-m", "ptdash.tui.cli", "ctl", str(run.run_dir), *words, "--json"],
                         capture_output=True, text=True, timeout=120, env=ENV, stdin=subprocess.DEVNULL)
    assert out.stdout.strip(), out.stderr
    return out.returncode, json.loads(out.stdout)


def trace(path: Path) -> dict[int, list[float]]:
    """Step -> (LR used, gradient norm used) for each optimizer, as the script measured them."""
    rows = {}
    for line in path.read_text().splitlines():
        step, *values = line.split()
        rows[int(step)] = [float(v) for v in values]
    return rows


def wait_trace(path: Path, step: int) -> dict[int, list[float]]:
    return wait_for(lambda: path.exists() and (rows := trace(path)) and max(rows) >= step and rows,
                    90, what=f"step {step} in the script's trace")


def check_lr(rows, lrs, scale, steps) -> None:
    for s in steps:
        for i, lr in enumerate(lrs):
            assert math.isclose(rows[s][2 * i], scale * lr(s), rel_tol=1e-4), (s, i, rows[s], scale)


def pause_and_resume(run: Run, steps_of) -> None:
    """``ctl pause``: no step ends until ``ctl resume`` (by the steps' own end times)."""
    code, paused = ctl(run, "pause")
    assert code == 0 and paused["ok"], paused
    for rank in steps_of:
        run.wait_step(paused["step"], rank=rank)
    time.sleep(0.5)
    sent = time.time()
    code, resumed = ctl(run, "resume")
    assert code == 0 and resumed["ok"] and resumed["step"] == paused["step"], resumed
    for rank in steps_of:
        run.wait_step(paused["step"] + 1, rank=rank)
        walls = run.walls(rank)
        assert max(w for s, w in walls.items() if s <= paused["step"]) < sent
        assert min(w for s, w in walls.items() if s > paused["step"]) >= sent
    code, again = ctl(run, "resume")
    assert code == 1 and not again["ok"] and again["message"] == "not paused"


def every_command(run: Run, traces: list[Path], lrs, optimizers: int, refused: str | None) -> None:
    """pause, resume, lr-scale, clip, clip off, checkpoint, profile, rollback, stop: each takes effect or
    is refused."""
    ranks = range(len(traces))
    for path in traces:
        rows = wait_trace(path, 5)
    # --lr-scale at the start: applied from the first step, or said not to be at the first step.
    for path in traces:
        check_lr(trace(path), lrs, 1.0 if refused else START_SCALE, range(1, 6))
    if refused:
        warned = wait_for(lambda: [e for e in run.events() if e.kind == "warning" and refused in e.message], 30,
                          what="the warning about --lr-scale")
        assert warned[0].message.startswith("--lr-scale 0.5 is not applied") and warned[0].step <= 1
        assert run.info().lr_scale in (None, 1.0)
    # The status says whether the LR factor can act (the dashboard dims its key when not).
    status = wait_for(lambda: _status_after(run, 5), 60, what="a status after step 5")
    assert status.lr_fixed is bool(refused) and status.lr_scale == (1.0 if refused else START_SCALE)
    pause_and_resume(run, ranks)

    code, ack = ctl(run, "lr-scale", str(LIVE_SCALE))
    if refused:
        assert code == 1 and not ack["ok"] and ack["message"] == refused, ack
    else:
        assert code == 0 and ack["ok"] and f"-> {LIVE_SCALE:g} from step {ack['step'] + 1}" in ack["message"]
    for path in traces:
        rows = wait_trace(path, ack["step"] + 5)
        check_lr(rows, lrs, START_SCALE if not refused else 1.0, range(6, ack["step"] + 1))
        check_lr(rows, lrs, 1.0 if refused else LIVE_SCALE, range(ack["step"] + 1, ack["step"] + 5))

    code, ack = ctl(run, "clip", str(CLIP))
    assert code == 0 and ack["ok"], ack
    for path in traces:
        rows = wait_trace(path, ack["step"] + 5)
        assert max(rows[s][i] for s in range(1, ack["step"] + 1) for i in range(1, len(lrs) * 2, 2)) > 2 * CLIP
        after = [rows[s][i] for s in range(ack["step"] + 1, ack["step"] + 5) for i in range(1, len(lrs) * 2, 2)]
        assert max(after) <= CLIP * (1 + 1e-5), after
    code, ack = ctl(run, "clip", "off")  # the script's own clipping (or none) again
    assert code == 0 and ack["ok"] and ack["message"].startswith(f"clip norm {CLIP:g} -> the script's own"), ack
    for path in traces:
        rows = wait_trace(path, ack["step"] + 5)
        after = [rows[s][i] for s in range(ack["step"] + 1, ack["step"] + 5) for i in range(1, len(lrs) * 2, 2)]
        assert max(after) > 2 * CLIP, after

    code, ack = ctl(run, "checkpoint")
    assert code == 0 and ack["ok"], ack
    ckpt = torch.load(run.run_dir / "checkpoints" / f"step-{ack['step']}.pt", weights_only=True)
    assert ckpt["ptdash"]["step"] == ack["step"] and ckpt["models"], ckpt.keys()
    assert len(ckpt["optimizers"]) == optimizers
    for state in ckpt["models"].values():
        assert {k.split(".")[-1] for k in state} == {"weight", "bias"}

    code, ack = ctl(run, "profile", "2")
    assert code == 0 and ack["ok"] and ack["message"] == f"profiling steps {ack['step'] + 1}-{ack['step'] + 2}"
    wait_for(lambda: list((run.run_dir / "profiles").glob(f"profile-step{ack['step'] + 1}-*.json")), 90,
             what="the profile's trace")

    code, ack = ctl(run, "rollback")  # started without --rollback-every or --on-anomaly rollback
    assert code == 1 and not ack["ok"] and ack["message"].startswith("this run keeps no snapshot to roll back to"), ack

    code, ack = ctl(run, "stop")
    assert code == 0 and ack["ok"], ack
    assert run.wait(90) == 0
    assert "finally ran" in run.output()
    assert run.info().status == "stopped"
    assert (run.run_dir / "checkpoints" / f"step-{ack['step']}.pt").exists()


def _status_after(run: Run, step: int) -> Status | None:
    """The next Status the engine sent for a step after ``step`` (None when none came in a second)."""
    msg = run.client.recv(timeout=1)
    while msg is not None:
        if isinstance(msg, Status) and msg.step > step:
            return msg
        msg = run.client.recv(timeout=1)
    return None


class KindRun(Run):
    def __init__(self, tmp_path, *args, **kwargs) -> None:
        self.cwd = tmp_path
        super().__init__(tmp_path, *args, **kwargs)

    def events(self):
        with self.store() as s:
            return s.events()

    def close(self) -> None:
        ranks = processes_in(self.cwd)  # under DDP: the ranks, which the engine's end does not take
        super().close()
        kill_all(ranks)


@pytest.mark.parametrize("kind", sorted(CELLS))
def test_each_command_takes_effect_or_is_refused_with_its_reason(tmp_path, kind):
    lrs, optimizers, refused = CELLS[kind]
    path = tmp_path / "trace.txt"
    run = KindRun(tmp_path, KINDS, "--kind", kind, "--lr", str(LR), "--trace", str(path),
                  options=("--lr-scale", str(START_SCALE)))
    try:
        every_command(run, [path], lrs, optimizers, refused)
    finally:
        run.close()


@pytest.mark.slow
def test_each_command_takes_effect_on_both_ranks_of_ddp(tmp_path):
    path = tmp_path / "trace.txt"
    run = KindRun(tmp_path, KINDS, "--kind", "ddp", "--lr", str(LR), "--trace", str(path),
                  options=("--nproc-per-node", "2", "--lr-scale", str(START_SCALE)))
    try:
        every_command(run, [Path(f"{path}.0"), Path(f"{path}.1")], (lambda s: LR,), 1, None)
    finally:
        run.close()


def test_rollback_on_a_script_with_no_optimizer_is_refused_with_its_reason(tmp_path):
    """Snapshots are taken at an optimizer's steps: a script that updates its parameters itself
    keeps none, and a rollback asked for says why (not 'the first snapshot is taken at step 5')."""
    path = tmp_path / "trace.txt"
    run = KindRun(tmp_path, KINDS, "--kind", "manual", "--lr", str(LR), "--trace", str(path),
                  options=("--rollback-every", "5"))
    try:
        wait_trace(path, 12)
        code, ack = ctl(run, "rollback")
        assert code == 1 and not ack["ok"], ack
        assert ack["message"] == ("nothing to roll back to: the script updates its parameters itself "
                                  "(no torch.optim optimizer)"), ack
        code, ack = ctl(run, "stop")
        assert code == 0 and run.wait(90) == 0
    finally:
        run.close()
