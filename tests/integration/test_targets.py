"""With no RUN, ``ptdash ctl`` and ``ptdash attach`` act only on a clear choice, and every
reply names the run it acted on. Real engines through the real CLI, in a runtime dir (and
so a live-run registry) of their own."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from support.runner import ENV, SCRIPTS, Run, ptdash

STEADY = SCRIPTS / "steady.py"


@pytest.fixture
def env():
    runtime = tempfile.mkdtemp(prefix="ptd-")
    yield {**ENV, "XDG_RUNTIME_DIR": runtime}
    shutil.rmtree(runtime, ignore_errors=True)


def start(where: Path, env: dict, run_dir: Path | None = None) -> Run:
    where.mkdir(parents=True, exist_ok=True)
    return Run(where, STEADY, "--sleep", "0.05", env=env, run_dir=run_dir)


def test_ctl_and_attach_without_a_run_act_only_on_a_clear_choice(tmp_path, env):
    empty = tmp_path / "empty"
    empty.mkdir()
    project = tmp_path / "project"
    started = []
    try:
        first = start(tmp_path / "a", env)
        started.append(first)
        first.wait_step(2)
        # The user's only live run: found from anywhere, and the reply names it.
        one = ptdash("ctl", "lr-scale", "0.5", cwd=empty, env=env)
        assert one.returncode == 0, one.stderr
        assert one.stdout.startswith(f"{first.run_dir}: lr_scale: at step ") and "LR factor 1 -> 0.5" in one.stdout

        second = start(tmp_path / "b", env)
        started.append(second)
        for command in (["ctl", "pause"], ["attach"]):
            two = ptdash(*command, cwd=empty, env=env)
            assert two.returncode == 2, two.stderr
            lines = two.stderr.strip().splitlines()
            assert lines[0] == ("ptdash: error: 2 of your runs are live, so none was chosen; "
                                "name one (a run dir, name or id):")
            assert sorted(line.split()[-1] for line in lines[1:]) == sorted([str(first.run_dir),
                                                                             str(second.run_dir)])
            assert all(" live " in line for line in lines[1:])
        assert first.info().status == second.info().status == "running"  # nothing was paused

        # One live run under ./ptdash-runs is a clear choice, whatever runs elsewhere.
        here = start(project, env, run_dir=project / "ptdash-runs" / "here")
        started.append(here)
        paused = ptdash("ctl", "pause", cwd=project, env=env)
        assert paused.returncode == 0, paused.stderr
        assert paused.stdout.startswith("ptdash-runs/here: pause: at step ")
        assert here.info().status == "paused"
        assert first.info().status == second.info().status == "running"
        refused = ptdash("ctl", "pause", cwd=project, env=env)
        assert refused.returncode == 1 and refused.stdout.strip().endswith("pause refused: already paused")
        assert refused.stdout.startswith("ptdash-runs/here: ")

        # A name that several runs share is not a choice either; one that only one has is.
        many = ptdash("ctl", "run", "resume", cwd=project, env=env)
        assert many.returncode == 2 and "2 live runs match 'run'" in many.stderr
        named = ptdash("ctl", "here", "resume", cwd=tmp_path, env=env)
        assert named.returncode == 0 and named.stdout.startswith(f"{here.run_dir.relative_to(tmp_path)}: resume")
    finally:
        for run in started:
            run.close()


def test_bad_values_from_ctl_are_refused_in_one_line_and_training_goes_on(tmp_path, env):
    run = start(tmp_path, env)
    try:
        run.wait_step(2)
        for words, needle in ((["lr-scale", "1e308"], "LR factor must be from 1e-6 to 1000, got '1e308'"),
                              (["clip", "1e309"], "clip norm must be a finite number > 0"),
                              (["profile", "1e12"], "profile length must be a whole number of steps from 1 to 1000"),
                              (["clip", "abc"], "clip norm must be a number or off, got 'abc'")):
            result = ptdash("ctl", str(run.run_dir), *words, cwd=tmp_path, env=env)
            assert result.returncode == 1, result.stderr
            (line,) = result.stderr.strip().splitlines()
            assert line.startswith(f"ptdash: error: {needle}"), line
            assert result.stdout == ""
        # The engine refuses the same values from a client that skips the CLI's checks.
        for name, value in (("lr_scale", 1e308), ("clip", 1e300), ("profile", 1e12)):
            ack = run.send(name, value)
            assert not ack.ok and "must be" in ack.message
        before = run.last_step()
        run.wait_step(before + 5)  # training went on throughout
        info = run.info()
        assert info.status == "running" and info.clip is None and info.lr_scale == 1.0
    finally:
        run.close()
