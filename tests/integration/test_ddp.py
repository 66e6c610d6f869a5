"""Two ranks on CPU (gloo) through the real launcher: metrics, commands, pause, failures."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
import torch

from support.runner import ENV, SCRIPTS, Run, processes_in, wait_for

DDP = SCRIPTS / "ddp_train.py"
pytestmark = pytest.mark.slow


class DdpRun(Run):
    def __init__(self, tmp_path, *args, env=None, options=()):
        self.cwd = tmp_path
        if env:
            ENV.update(env)
        try:
            super().__init__(tmp_path, DDP, *args, options=("--nproc-per-node", "2", *options))
        finally:
            for k in env or {}:
                ENV.pop(k)

    def rank_step(self, rank: int) -> int:
        with self.store() as s:
            return s.last_step(rank) or 0

    def close(self) -> None:
        pids = _rank_pids(self.cwd)
        super().close()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _rank_pids(cwd: Path) -> list[int]:
    """This test's ranks: the processes running the DDP script in the test's own directory.
    Another test session's ranks on the same machine (CI beside a developer's run) are not
    this test's to count or to kill."""
    out = subprocess.run(["pgrep", "-f", f"ptdash.bootstrap {DDP}"], capture_output=True, text=True).stdout
    mine = set(processes_in(cwd))
    return [int(p) for p in out.split() if int(p) in mine]


def test_a_long_pause_then_checkpoint_and_stop_reach_both_ranks(tmp_path):
    # One job for the whole story (starting two ranks costs most of the time): a 3 s
    # process-group timeout, and a pause twice that long must not kill the job.
    run = DdpRun(tmp_path, env={"PTDASH_TEST_PG_TIMEOUT": "3"})
    try:
        wait_for(lambda: run.rank_step(0) >= 5 and run.rank_step(1) >= 5, 90, what="both ranks stepping")
        paused = run.send("pause")
        # No step ends on either rank while paused (by the steps' own end times), for
        # twice the process-group timeout; then both go on from the same step.
        run.resume_after_hold(paused, hold=6.0, ranks=(0, 1))
        assert "Timed out" not in run.output()

        ck = run.send("checkpoint")
        assert ck.ok
        path = run.run_dir / "checkpoints" / f"step-{ck.step}.pt"
        state = torch.load(path, weights_only=True)["models"]["Sequential"]
        assert not any(k.startswith("module.") for k in state)  # unwrapped from DDP
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        model.load_state_dict(state)
        assert run.send("stop").ok
        assert run.wait(90) == 0
        out = run.output()
        assert "rank 0 finally ran" in out and "rank 1 finally ran" in out
        p0, p1 = (torch.load(tmp_path / f"params-{r}.pt") for r in (0, 1))
        for key in p0:
            assert torch.equal(p0[key], p1[key]), key
        assert run.info().status == "stopped" and run.info().world_size == 2
        with run.store() as s:
            channel = [e for e in s.events() if e.message.startswith("rank channel:")]
        assert channel and channel[0].data["exchanges"] > 0
        print(channel[0].message)
    finally:
        run.close()


def test_a_clip_sent_while_both_ranks_are_thinned_takes_effect_at_the_same_step_on_each(tmp_path):
    # Fast steps and a budget none can meet: past their learning steps both ranks run lean
    # steps without the pre-step hook; the command still reaches both at one boundary.
    run = DdpRun(tmp_path, "--sleep", "0", options=("--overhead-budget", "0.001"))
    try:
        wait_for(lambda: run.rank_step(0) >= 400 and run.rank_step(1) >= 400, 120, what="both ranks past 400")
        ack = run.send("clip", 0.5)
        assert ack.ok and f"from step {ack.step + 1}" in ack.message
        wait_for(lambda: min(run.rank_step(0), run.rank_step(1)) >= ack.step + 20, 60, what="20 steps more")
        assert run.send("stop").ok
        assert run.wait(90) == 0
        with run.store() as s:
            firsts = [s.series("grad/clip_max", rank=r)[0][:1] for r in (0, 1)]
            sampling = [e for e in s.events() if e.kind == "sampling"]
        assert firsts == [[ack.step + 1], [ack.step + 1]]
        assert {e.rank for e in sampling} == {0, 1}  # both ranks were thinned
        p0, p1 = (torch.load(tmp_path / f"params-{r}.pt") for r in (0, 1))
        assert all(torch.equal(p0[k], p1[k]) for k in p0)  # the ranks stayed in step
    finally:
        run.close()


def test_sigkill_of_rank_1_is_reported_and_nothing_is_left_behind(tmp_path):
    run = DdpRun(tmp_path)
    try:
        wait_for(lambda: run.rank_step(1) >= 3, 90, what="rank 1 stepping")
        rank1 = [p for p in _rank_pids(tmp_path) if "RANK=1" in open(f"/proc/{p}/environ", "rb").read().decode(errors="ignore").replace("\0", " ") + " "]
        assert len(rank1) == 1
        os.kill(rank1[0], signal.SIGKILL)
        code = run.proc.wait(90)
        assert code != 0
        info = run.info()
        assert info.status == "crashed"
        assert info.rank_failures[0] == {"rank": 1, "exitcode": -signal.SIGKILL}
        with run.store() as s:
            assert any("rank 1 killed by SIGKILL" in e.message for e in s.events())
        wait_for(lambda: not _rank_pids(tmp_path), 30, what="every rank to exit")
    finally:
        run.close()


def test_users_own_torchrun_runs_the_engine_module(tmp_path):
    """`torchrun ... -m ptdash.bootstrap train.py`: rank 0 makes the run dir; ctl steers it."""
    import sys

    from support.runner import ptdash

    env = {**ENV, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "-m", "ptdash.bootstrap", str(DDP), "--steps", "100000", "--sleep", "0.02"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        run_json = wait_for(lambda: list((tmp_path / "ptdash-runs").glob("*/run.json")), 90,
                            what="rank 0 to create the run dir")
        run_dir = run_json[0].parent
        from ptdash.shared.reader import StoreReader

        def steps():
            try:
                with StoreReader(run_dir / "metrics.db") as s:
                    return (s.last_step(0) or 0, s.last_step(1) or 0)
            except Exception:
                return (0, 0)
        wait_for(lambda: min(steps()) >= 3, 90, what="both ranks stepping")
        listed = ptdash("ls", cwd=tmp_path)
        line = next(x for x in listed.stdout.splitlines() if run_dir.name in x)
        assert line.split()[1] == "live", listed.stdout
        paused = ptdash("ctl", str(run_dir), "pause", cwd=tmp_path)
        assert paused.returncode == 0 and "paused at step" in paused.stdout, paused.stderr
        at = int(paused.stdout.rsplit("paused at step ", 1)[1].split()[0].rstrip(":;,"))
        wait_for(lambda: steps() == (at, at), 60, what=f"both ranks at step {at}")
        assert ptdash("ctl", str(run_dir), "stop", cwd=tmp_path).returncode == 0  # applied while paused
        out, _ = proc.communicate(timeout=90)
        assert proc.returncode == 0, out[-2000:]
        assert "rank 0 finally ran" in out and "rank 1 finally ran" in out
        assert steps() == (at, at)  # neither rank made a step after the pause
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in _rank_pids(tmp_path):
            os.kill(pid, signal.SIGKILL)
