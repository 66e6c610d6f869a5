"""``ptdash fork``: a new run from one of a run's checkpoints, through the real CLI."""

from __future__ import annotations

import json
import math
import re
import shutil
import sys

from ptdash.shared import rundir
from ptdash.shared.reader import StoreReader
from ptdash.shared.store import STORE_NAME
from support.runner import ENV, SCRIPTS, ptdash
from support.tmux import Terminal, require_tmux


def _series(run_dir, name):
    with StoreReader(run_dir / STORE_NAME) as s:
        return dict(zip(*s.series(name)))


def _only_run(root, but=()):
    (path,) = [p for p in root.iterdir() if p not in but]
    return path


def test_fork_resumes_at_the_fork_step_names_its_parent_and_is_drawn_over_it(tmp_path):
    proj, elsewhere = tmp_path / "proj", tmp_path / "elsewhere"
    proj.mkdir()
    elsewhere.mkdir()
    # The parent: a relative script argument, so the fork must run in the parent's directory.
    script = proj / "train.py"
    shutil.copy(SCRIPTS / "steady.py", script)
    parent = ptdash("--headless", "--checkpoint-every", "10", "train.py", "--steps", "40", "--sleep", "0",
                    "--params-out", "params.pt", cwd=proj)
    assert parent.returncode == 0, parent.stdout + parent.stderr
    runs = proj / rundir.DEFAULT_ROOT
    parent_dir = _only_run(runs)
    (proj / "params.pt").unlink()

    # From another directory, by the parent's name: the same loop from step 21, losses identical.
    child = ptdash("fork", "train", "--at", "20", cwd=elsewhere, timeout=180)
    assert child.returncode == 0, child.stdout + child.stderr
    assert f"[ptdash] fork of {parent_dir} at step 20 (step-20.pt), in {proj}" in child.stdout
    child_dir = _only_run(runs, but=(parent_dir,))
    info, parent_info = rundir.read_info(child_dir), rundir.read_info(parent_dir)
    assert (info.parent, info.parent_id, info.fork_step) == (str(parent_dir), parent_info.id, 20)
    assert info.name == "train-fork20" and info.cwd == str(proj) and info.argv == parent_info.argv
    assert info.config.resume == str(parent_dir / "checkpoints" / "step-20.pt")
    assert info.config.checkpoint_every == 10  # the parent's options
    assert info.start_step == 20 and info.status == "finished"
    assert (proj / "params.pt").is_file() and not (elsewhere / "params.pt").exists()
    parent_loss, child_loss = _series(parent_dir, "loss"), _series(child_dir, "loss")
    assert min(child_loss) == 21 and max(child_loss) == 40
    assert all(child_loss[s] == parent_loss[s] for s in range(21, 41))  # bit for bit

    # An option changed: the LR factor from step 31 on, the same schedule under it.
    scaled = ptdash("fork", str(parent_dir), "--at", "30", "--lr-scale", "0.5", "--name", "halved",
                    cwd=elsewhere, timeout=180)
    assert scaled.returncode == 0, scaled.stdout + scaled.stderr
    scaled_dir = _only_run(runs, but=(parent_dir, child_dir))
    assert rundir.read_info(scaled_dir).fork_step == 30
    parent_lr, scaled_lr = _series(parent_dir, "opt/lr/group0"), _series(scaled_dir, "opt/lr/group0")
    assert min(scaled_lr) == 31
    assert all(math.isclose(scaled_lr[s], 0.5 * parent_lr[s], rel_tol=1e-12) for s in range(31, 41))

    listed = ptdash("ls", cwd=proj).stdout
    (line,) = [ln for ln in listed.splitlines() if child_dir.name in ln]
    assert line.endswith(f"(fork of {parent_dir.name} at step 20)")
    shown = ptdash("show", str(child_dir), "--once", cwd=proj).stdout
    assert f"forked from {parent_dir} at step 20" in shown
    as_json = json.loads(ptdash("show", str(child_dir), "--json", cwd=proj).stdout)
    assert as_json["parent"] == {"run_dir": str(parent_dir), "id": parent_info.id, "step": 20}

    # show draws the parent behind the child, named in the charts' legend.
    require_tmux()
    term = Terminal("fork")
    try:
        term.start("show", f"{sys.executable} -m ptdash.tui.cli show {child_dir}", cwd=proj, width=120, height=40,
                   env={"XDG_RUNTIME_DIR": ENV["XDG_RUNTIME_DIR"], "OMP_NUM_THREADS": "1"})
        # The parent is read on a thread of its own after the first frame: wait for its legend.
        term.wait_for("show", re.compile(r"loss +━ train-fork20 \S+ +━ train \S+"), timeout=90)
    finally:
        term.close()


def test_a_fork_is_refused_in_one_line_when_its_checkpoint_or_options_cannot_be(tmp_path):
    parent = ptdash("--headless", "--run-dir", "p", "--checkpoint-every", "5", str(SCRIPTS / "steady.py"),
                    "--steps", "10", "--sleep", "0", cwd=tmp_path)
    assert parent.returncode == 0, parent.stdout + parent.stderr
    before = sorted(tmp_path.rglob("*"))
    for words, message in [
        (["--at", "7"], f"ptdash: error: {tmp_path / 'p'} has no checkpoint at step 7; it has steps 5, 10"),
        (["--at", "5", "--from", "x.pt"], "not allowed with argument"),
        (["--from", "nope.pt"], "checkpoint"),
        (["--resume", "x.pt"], "--resume is not an option of ptdash fork"),
        (["--lr-scale", "-1"], "--lr-scale"),
        (["--at", "5", "extra"], "unrecognized arguments: extra"),
    ]:
        out = ptdash("fork", "p", *words, cwd=tmp_path)
        assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, (words, out.stderr)
        assert message in out.stderr, (words, out.stderr)
    assert sorted(tmp_path.rglob("*")) == before  # nothing made
