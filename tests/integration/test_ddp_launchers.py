"""DDP as people launch it, through the real CLI with two gloo ranks on CPU: ptdash's own
launcher (``--nproc-per-node``), the textbook ``mp.spawn`` skeleton, and a script that
re-executes the interpreter for its rank 1 the way Lightning does. On each: both ranks'
losses stored, a pause sent at the first steps applied at once on both ranks, a clip
change applied at the same step on both (their parameters stay bit-identical), a stop
that runs every rank's ``finally``; and a killed launcher leaves no process behind."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest
import torch

from ptdash.shared import events
from support.runner import ENV, SCRIPTS, Run, kill_all, processes_in, ptdash, wait_for

pytestmark = pytest.mark.slow

LAUNCHERS = {
    "nproc-per-node": (SCRIPTS / "ddp_train.py", ("--nproc-per-node", "2")),
    "mp.spawn": (SCRIPTS / "ddp_spawn.py", ()),
    "reexec": (SCRIPTS / "ddp_reexec.py", ()),
    "fork": (SCRIPTS / "ddp_spawn.py", (), "--fork", "--workers", "2"),  # and DataLoader workers, not ranks
}


def _events(run: Run) -> list:
    with run.store() as s:
        return s.events()


@pytest.mark.parametrize("launcher", list(LAUNCHERS))
def test_commands_reach_both_ranks_from_the_first_steps(tmp_path, launcher):
    script, options, *flags = LAUNCHERS[launcher]
    run = Run(tmp_path, script, "--sleep", "0.02", *flags, options=options)
    try:
        wait_for(lambda: run.last_step(0) >= 2 and run.last_step(1) >= 2, 120, what="both ranks stepping")
        sent_step, sent = run.last_step(0), time.time()
        paused = run.send("pause")
        latency = time.time() - sent
        assert paused.ok, paused
        # Applied at the first exchange: before any step time is known the ranks exchange
        # at every step, and never more than half a second apart (it was step 1000).
        print(f"{launcher}: pause sent at step {sent_step}, applied at step {paused.step}, ack after {latency:.3f} s")
        assert paused.step - sent_step < 30, (sent_step, paused.step)
        run.resume_after_hold(paused, ranks=(0, 1))

        clip = run.send("clip", 0.25)
        assert clip.ok, clip
        for rank in (0, 1):
            run.wait_step(clip.step + 5, rank=rank)
            steps, values = run.series("grad/clip_max", rank=rank)
            assert [v for s, v in zip(steps, values) if s > clip.step] and \
                all(v == 0.25 for s, v in zip(steps, values) if s > clip.step), rank
            assert all(v != 0.25 for s, v in zip(steps, values) if s <= clip.step), rank
        stop = run.send("stop")
        assert stop.ok, stop
        assert run.wait(120) == 0
        out = run.output()
        assert "rank 0 finally ran" in out and "rank 1 finally ran" in out
        assert "Traceback" not in out, out
        p0, p1 = (torch.load(tmp_path / f"params-{r}.pt") for r in (0, 1))
        for key in p0:
            assert torch.equal(p0[key], p1[key]), key  # bit-identical replicas after the live clip
        info = run.info()
        assert info.status == "stopped" and info.exit_code == 0 and info.world_size == 2
        assert info.step >= stop.step  # the run's step, wherever rank 0 ran
        with run.store() as s:
            assert s.last_step(0) >= stop.step and s.last_step(1) >= stop.step
            losses = {rank: s.series("loss", rank=rank)[1] for rank in (0, 1)}
            messages = [e.message for e in s.events()]
        assert all(len(v) >= stop.step and all(x is not None for x in v) for v in losses.values())
        assert "rank channel up: 2 ranks" in messages and not [m for m in messages if "never reached" in m]
        wait_for(lambda: not processes_in(tmp_path), 30, what="no rank left")
    finally:
        run.close()
        kill_all(processes_in(tmp_path))


@pytest.mark.parametrize("launcher", ["nproc-per-node", "mp.spawn", "reexec"])
def test_a_killed_launcher_leaves_no_rank_behind(tmp_path, launcher):
    script, options, *flags = LAUNCHERS[launcher]
    run = Run(tmp_path, script, "--sleep", "0.02", *flags, options=options)
    try:
        wait_for(lambda: run.last_step(0) >= 2 and run.last_step(1) >= 2, 120, what="both ranks stepping")
        hub = run.info().pid  # the process ptdash started: the launcher of every rank
        assert len(processes_in(tmp_path)) >= 2
        victim = hub
        if launcher == "nproc-per-node":  # there the launcher is ptdash.launch, rank 0's parent
            victim = int(open(f"/proc/{hub}/stat").read().rpartition(")")[2].split()[1])
            assert b"ptdash.launch" in open(f"/proc/{victim}/cmdline", "rb").read()
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: not processes_in(tmp_path), 60, what="every rank to end with its launcher")
    finally:
        run.close()
        kill_all(processes_in(tmp_path))


def test_a_rank_started_without_ptdash_is_named_and_clip_is_refused(tmp_path):
    run = Run(tmp_path, SCRIPTS / "ddp_reexec.py", "--sleep", "0.02", "--bare-child")
    try:
        wait_for(lambda: run.last_step(0) >= 3, 120, what="rank 0 stepping")
        warning = wait_for(lambda: [e for e in _events(run) if e.kind == "warning"
                                    and "never reached ptdash" in e.message], 30, what="the warning")
        assert "rank 1 of 2 never reached ptdash" in warning[0].message
        clip = run.send("clip", 0.5)
        assert not clip.ok and "rank 1 run without ptdash" in clip.message, clip
        lr = run.send("lr_scale", 0.5)
        assert not lr.ok and "rank 1" in lr.message
        paused = run.send("pause")  # reaches rank 0, which the other rank then waits for
        assert paused.ok and paused.step >= 3
        with run.store() as s:
            assert s.last_step(1) is None  # nothing pretends to know rank 1
    finally:
        run.close()
        kill_all(processes_in(tmp_path))


def test_a_stopped_rank_is_named_stalled_and_the_rank_waiting_for_it_is_not(tmp_path):
    run = Run(tmp_path, SCRIPTS / "ddp_spawn.py", "--sleep", "0.02", options=("--stall-timeout", "2"))
    try:
        wait_for(lambda: run.last_step(0) >= 3 and run.last_step(1) >= 3, 120, what="both ranks stepping")
        log = (run.run_dir / "engine.log").read_text()
        rank1 = int(re.search(r"rank 1 of 2 \(pid (\d+)\)", log).group(1))
        os.kill(rank1, signal.SIGSTOP)
        try:
            stall = wait_for(lambda: [e for e in _events(run) if "stalled" in e.message], 60, what="the stall")
            # Its last report may be steps behind rank 0's (the hub heard of it at its flushes).
            assert re.match(r"rank 1 stalled: no step (for \d+ s \(at step|reported for \d+ s \(the last at step) \d+\)",
                            stall[0].message), stall[0].message
            assert "its process is stopped" in stall[0].message
            listed = ptdash("ls", cwd=tmp_path, env={**ENV, "COLUMNS": "200"})
            assert "stalled" in listed.stdout, listed.stdout
            assert "stalled" in run.info().stalled
        finally:
            os.kill(rank1, signal.SIGCONT)
        wait_for(lambda: any(e.message.endswith(": every rank makes steps again") for e in _events(run)), 60,
                 what="the ranks to make steps again")
        # Rank 0 waited for rank 1 (the stall's stacks say so): it is never named stalled.
        stalls = [events.read(e) for e in _events(run) if e.kind == "stall"]
        assert stalls and all(0 not in s.ranks for s in stalls), stalls
        assert not any(e.message.startswith(("rank 0 stalled", "ranks 0,")) for e in _events(run))
        assert run.info().stalled is None
        assert run.send("stop").ok
        assert run.wait(120) == 0
    finally:
        run.close()
        kill_all(processes_in(tmp_path))


@pytest.mark.parametrize("launcher", ["reexec", "mp.spawn", "fork"])
def test_a_crashed_rank_is_recorded_and_the_run_ends_crashed(tmp_path, launcher):
    # mp.spawn's wrapper catches the rank's exception and exits 1; a multiprocessing.Process
    # target's exception ends its process: neither reaches sys.excepthook.
    script, options, *flags = LAUNCHERS[launcher]
    run = Run(tmp_path, script, "--sleep", "0.02", "--crash-rank1-at", "20", *flags[:1], options=options)
    try:
        code = run.wait(120)
        assert code != 0
        info = run.info()
        assert info.status == "crashed", info
        messages = [e.message for e in _events(run)]
        assert any(m.startswith("rank 1 crashed with exit code 1: RuntimeError: rank 1 fails at step 20")
                   for m in messages), messages
        with run.store() as s:
            assert s.last_step(1) == 19
    finally:
        run.close()
        kill_all(processes_in(tmp_path))
