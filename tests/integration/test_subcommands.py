"""Every subcommand's arguments, its machine-readable output, and what it does without a terminal.

Real subprocesses of the real CLI; stdout is a pipe here, as in a script or a CI log, so
``show`` and ``attach`` must print their summary and exit instead of drawing a screen.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest

from ptdash.shared import rundir
from ptdash.shared.reader import StoreReader
from ptdash.shared.store import STORE_NAME
from support.recorded_run import make_ddp_run, make_run
from support.runner import ENV, SCRIPTS, Run, ptdash

RECORDED = Path(__file__).parents[1] / "tui" / "runs"

SUBCOMMANDS = ("ls", "attach", "show", "doctor", "ctl", "export", "demo")


@pytest.mark.parametrize("sub", SUBCOMMANDS)
def test_every_subcommand_has_help(sub, tmp_path):
    result = ptdash(sub, "--help", cwd=tmp_path, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: ptdash {sub}") and "--help" in result.stdout
    assert not (tmp_path / rundir.DEFAULT_ROOT).exists()  # demo --help makes no run dir


def test_demo_help_shows_the_demo_options(tmp_path):
    result = ptdash("demo", "--help", cwd=tmp_path, timeout=60)
    assert "--steps" in result.stdout and "--n-layer" in result.stdout


REQUIRED = {"show": ["x"], "export": ["x", "--format", "csv"]}
"""What a subcommand needs besides the unknown flag (argparse names a missing argument first)."""


@pytest.mark.parametrize("sub", [s for s in SUBCOMMANDS if s != "demo"])
def test_unknown_flags_are_one_line_and_exit_2(sub, tmp_path):
    result = ptdash(sub, *REQUIRED.get(sub, []), "--frobnicate", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ptdash: error: ") and "--frobnicate" in lines[0], result.stderr
    assert f"ptdash {sub} --help" in lines[0]


@pytest.fixture
def own_registry():
    """An environment whose live-run registry is this test's alone (other tests' runs stay out of ``ls``)."""
    runtime = tempfile.mkdtemp(prefix="ptd-")
    yield {**ENV, "XDG_RUNTIME_DIR": runtime}
    shutil.rmtree(runtime, ignore_errors=True)


def test_ls_json_and_filters(tmp_path, own_registry):
    root = tmp_path / rundir.DEFAULT_ROOT
    make_run(root, steps=30, status="finished", exit_code=0, name="alpha")
    make_run(root, steps=20, status="crashed", exit_code=1, name="beta")

    def ls(*args):
        return ptdash("ls", *args, cwd=tmp_path, env=own_registry).stdout

    listed = json.loads(ls("--json"))
    assert {r["name"]: (r["state"], r["step"]) for r in listed} == {"alpha": ("finished", 30), "beta": ("crashed", 20)}
    assert {"run_dir", "id", "started", "exit_code", "argv"} <= set(listed[0])
    assert [r["name"] for r in json.loads(ls("--json", "--state", "crashed"))] == ["beta"]
    assert [r["name"] for r in json.loads(ls("--json", "--name", "alp"))] == ["alpha"]
    assert "no runs here" in ls("--state", "live")


def test_ls_all_finds_finished_runs_anywhere_and_forgets_removed_ones(tmp_path, monkeypatch, own_registry):
    state = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(state))  # this test's own list of every run
    env = {**own_registry, "XDG_STATE_HOME": str(state)}
    one = make_run(tmp_path / "project-a" / rundir.DEFAULT_ROOT, steps=10, status="finished", exit_code=0, name="one")
    two = make_run(tmp_path / "project-b" / rundir.DEFAULT_ROOT, steps=10, status="stopped", exit_code=0, name="two")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert json.loads(ptdash("ls", "--json", cwd=elsewhere, env=env).stdout) == []
    everywhere = json.loads(ptdash("ls", "--all", "--json", cwd=elsewhere, env=env).stdout)
    assert {r["run_dir"] for r in everywhere} == {str(one.resolve()), str(two.resolve())}
    stopped = json.loads(ptdash("ls", "--all", "--json", "--state", "stopped", cwd=elsewhere, env=env).stdout)
    assert [r["name"] for r in stopped] == ["two"]
    # `show` finds a run of the list by name from anywhere, as `ls --all` does.
    assert ptdash("show", "one", "--once", cwd=elsewhere, env=env).stdout.startswith("one  (finished")
    shutil.rmtree(one)
    assert [r["name"] for r in json.loads(ptdash("ls", "--all", "--json", cwd=elsewhere, env=env).stdout)] == ["two"]
    assert len(list((state / "ptdash" / "all-runs").iterdir())) == 1  # the removed run's record is pruned


def test_show_once_is_plain_text_and_exits_at_once(tmp_path):
    run_dir = make_ddp_run(tmp_path, steps=200, status="finished", exit_code=0)
    (run_dir / "checkpoints").mkdir()
    (run_dir / "checkpoints" / "step-100.pt").write_bytes(b"x")
    result = ptdash("show", str(run_dir), "--once", cwd=tmp_path, timeout=30)
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "\x1b" not in text
    for needle in ("(finished, exit code 0)", "steps       200 of 2,000", "duration", "steps/s", "loss        first",
                   "best", "last lr", "grad norm   min", "findings    2: grads-never-cleared (error), input-bound",
                   "checkpoints 1 in", "newest step-100.pt"):
        assert needle in text, (needle, text)


def test_show_once_json_parses(tmp_path):
    run_dir = make_run(tmp_path, steps=120, status="finished", exit_code=0)
    summary = json.loads(ptdash("show", str(run_dir), "--once", "--json", cwd=tmp_path).stdout)
    assert summary["state"] == "finished" and summary["step"] == 120 and summary["exit_code"] == 0
    assert summary["loss"]["first"]["step"] == 1 and summary["loss"]["last"]["step"] == 120
    assert summary["loss"]["best"]["value"] <= summary["loss"]["last"]["value"]
    with StoreReader(run_dir / STORE_NAME) as store:
        steps, norms = store.series("grad/norm_total")
    peak = max(range(len(norms)), key=norms.__getitem__)
    assert summary["grad_norm"]["max"] == {"step": steps[peak], "value": pytest.approx(norms[peak])}
    low = min(range(len(norms)), key=norms.__getitem__)
    assert summary["grad_norm"]["min"] == {"step": steps[low], "value": pytest.approx(norms[low])}
    other = make_run(tmp_path, steps=60, status="finished", exit_code=0, name="other")
    both = json.loads(ptdash("show", str(run_dir), str(other), "--json", cwd=tmp_path).stdout)
    assert [s["step"] for s in both] == [120, 60]


def test_show_with_stdout_redirected_exits_by_itself(tmp_path):
    run_dir = make_run(tmp_path, steps=50, status="finished", exit_code=0)
    result = ptdash("show", str(run_dir), cwd=tmp_path, timeout=30)  # no --once: stdout is a pipe
    assert result.returncode == 0 and "\x1b" not in result.stdout
    assert result.stdout.startswith("demo  (finished, exit code 0)")


def test_doctor_json_parses(tmp_path):
    run_dir = make_ddp_run(tmp_path, steps=60, status="finished", exit_code=0)
    result = ptdash("doctor", str(run_dir), "--json", cwd=tmp_path)
    assert result.returncode == 1  # findings
    report = json.loads(result.stdout)
    assert [f["id"] for f in report["findings"]] == ["grads-never-cleared", "input-bound"]
    assert report["findings"][0]["ranks"] == [0, 1] and report["findings"][0]["fix"]


def test_attach_without_a_terminal_prints_the_live_state_and_ctl_answers_in_json(tmp_path):
    run = Run(tmp_path, SCRIPTS / "steady.py", "--sleep", "0.02")
    try:
        run.wait_step(3)
        attached = ptdash("attach", str(run.run_dir), cwd=tmp_path, timeout=30)
        assert attached.returncode == 0, attached.stderr
        assert "(live)" in attached.stdout.splitlines()[0] and "\x1b" not in attached.stdout
        state = json.loads(ptdash("attach", str(run.run_dir), "--json", cwd=tmp_path).stdout)
        assert state["state"] == "live" and state["step"] >= 3
        paused = ptdash("ctl", str(run.run_dir), "pause", "--json", cwd=tmp_path)
        assert paused.returncode == 0, paused.stderr
        ack = json.loads(paused.stdout)
        assert ack["command"] == "pause" and ack["ok"] is True and isinstance(ack["step"], int)
        refused = ptdash("ctl", str(run.run_dir), "pause", "--json", cwd=tmp_path)
        answer = json.loads(refused.stdout)
        assert refused.returncode == (0 if answer["ok"] else 1)
        assert ptdash("ctl", str(run.run_dir), "stop", "--json", cwd=tmp_path).returncode == 0
        assert run.wait() == 0
    finally:
        run.close()


def test_stacks_of_a_run_that_ended_are_the_ones_its_stall_kept_said_as_such(tmp_path):
    # tests/tui/runs/one-hang: a real run whose training thread waited for a lock at step 9.
    shutil.copytree(RECORDED / "one-hang", tmp_path / "hung")
    result = ptdash("stacks", str(tmp_path / "hung"), cwd=tmp_path, timeout=60)
    assert result.returncode == 1, result.stderr  # none are of now
    lines = result.stdout.splitlines()
    assert lines[0] == "hung is finished at step 20: its stacks cannot be asked; these are the ones its stall at " \
                       "step 9 kept", lines[0]
    assert lines[1] == "rank 0 was in `wait_for_prefetch` (train.py:68)" and "  prefetch: prefetch  train.py:61" in lines
    answer = json.loads(ptdash("stacks", str(tmp_path / "hung"), "--json", cwd=tmp_path, timeout=60).stdout)
    assert answer["live"] is False and answer["state"] == "finished" and answer["kept"]["stall_step"] == 9
    assert answer["ranks"][0]["threads"][0]["training"] and "wait_for_prefetch" in answer["summary"]
    # A run that kept no stall: one line, nothing else.
    make_run(tmp_path / "runs", steps=30, status="finished", exit_code=0, name="calm")
    (calm,) = (tmp_path / "runs").iterdir()
    result = ptdash("stacks", str(calm), cwd=tmp_path, timeout=60)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.strip() == (f"ptdash: error: {calm.parent.name}/{calm.name} is finished at step 30: its stacks "
                                     "cannot be asked, and no stall kept any"), result.stderr
