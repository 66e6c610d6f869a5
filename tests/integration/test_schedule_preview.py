"""The LR schedule ahead of a real script under the real CLI: stored, right, and the run's total."""

from __future__ import annotations

import subprocess
import sys

from ptdash.shared import rundir
from ptdash.shared.reader import StoreReader
from ptdash.shared.store import STORE_NAME
from support.runner import SCRIPTS, ptdash


def test_a_cosine_schedule_is_previewed_and_gives_the_total(tmp_path):
    result = ptdash("--headless", "--run-dir", str(tmp_path / "run"), "--flush-interval", "0.05",
                    str(SCRIPTS / "cosine.py"), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    run_dir = tmp_path / "run"
    assert rundir.read_info(run_dir).total_steps == 300  # T_max: no OneCycleLR said it
    with StoreReader(run_dir / STORE_NAME) as store:
        schedule = store.schedule()
        steps, lrs = store.series("opt/lr/group0")
    assert schedule is not None and not schedule.note and schedule.end == 300
    recorded = dict(zip(steps, lrs))
    ahead = [(s, v) for s, v in zip(schedule.steps, schedule.lrs[0]) if s in recorded and s > schedule.step]
    assert len(ahead) > 50
    assert all(recorded[s] == v for s, v in ahead)  # exactly what the scheduler then set


def test_an_lr_set_by_hand_says_so(tmp_path):
    result = ptdash("--headless", "--run-dir", str(tmp_path / "run"), "--flush-interval", "0.05",
                    "--steps", "300", str(SCRIPTS / "cosine.py"), "--by-hand", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    with StoreReader(tmp_path / "run" / STORE_NAME) as store:
        schedule = store.schedule()
    assert schedule is not None and schedule.note == "set by hand" and schedule.steps == []
    assert rundir.read_info(tmp_path / "run").total_steps == 300  # --steps


UNREGISTERED = """
import torch
from torch.optim import lr_scheduler as L
from ptdash import schedule
from ptdash.discovery import Discovery
from ptdash.patching import Patches

discovery = Discovery()
discovery.attach(Patches())  # as the engine does: every scheduler created is registered
opt = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)
sched = L.SequentialLR(opt, [L.LinearLR(opt, 0.1, total_iters=5), L.StepLR(opt, 3)], milestones=[5])
registered = discovery.live(discovery.schedulers)
copy_ = schedule.twin(sched)
assert copy_._schedulers[0] is not sched._schedulers[0]
assert discovery.live(discovery.schedulers) == registered, "a copy was registered"
print("ok")
"""


def test_the_copy_is_not_registered_as_a_scheduler_of_the_script():
    """Discovery registers every scheduler created, and checkpoints save them all: a copy
    must not be one. In a fresh interpreter: the patch cannot be undone cleanly in this one."""
    out = subprocess.run([sys.executable, "-c", UNREGISTERED], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "ok", out.stderr
