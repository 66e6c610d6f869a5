"""``ptdash stacks``, ``ptdash ctl stacks`` and the stacks kept with a stall, through the real CLI.

Real runs of tests/scripts/hangs.py, which hangs one rank at a chosen step: spinning in
Python, blocked on its DataLoader worker's queue, skipping an all_reduce the other rank makes
(then waiting in a barrier), or running C code that holds the GIL. Each case is checked for
what a user needs: the stuck rank's function and line, and where the others wait, both on
demand and in the stall event the engine stored (and ``ptdash doctor``).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal

import pytest

from ptdash.shared import events
from ptdash.shared.stacks import read
from ptdash.tui.app import make_app
from ptdash.tui.source.live import LiveSource
from support.pilot import screen_text, until
from support.runner import SCRIPTS, Run, ptdash, rank_pid, wait_for

pytestmark = pytest.mark.slow


def _stall(run: Run) -> events.Stall | None:
    with run.store() as s:
        found = [w for e in s.events() if isinstance(w := events.read(e), events.Stall) and not w.ended]
    return found[0] if found else None


def _stacks(run: Run, tmp_path, *extra: str) -> tuple[int, dict]:
    done = ptdash("stacks", str(run.run_dir), "--json", *extra, cwd=tmp_path, timeout=60)
    assert done.stdout.strip(), done.stderr
    return done.returncode, json.loads(done.stdout)


def _training(answer: dict, rank: int) -> list:
    (found,) = [r for r in read(answer["ranks"]) if r.rank == rank]
    assert found.answered, found
    assert found.threads[0].training  # the training thread first
    return list(found.threads[0].frames)


def _start(tmp_path, hang: str, *options: str, rank: int = 1, at: int = 12) -> Run:
    shutil.copy(SCRIPTS / "hangs.py", tmp_path / "train.py")
    return Run(tmp_path, "train.py", "--hang", hang, "--at", str(at), "--rank", str(rank),
               options=("--stall-timeout", "3", *options))


def test_one_process_spinning_in_python_on_demand_and_at_the_stall(tmp_path):
    run = _start(tmp_path, "python", rank=0, at=5)
    try:
        stall = wait_for(lambda: _stall(run), 120, what="the stall stored")
        assert "rank 0 was in `wait_for_lost_shard` (train.py:" in stall.where, stall
        (taken,) = stall.stacks
        assert taken.training.frames[-1].func == "wait_for_lost_shard"
        code, answer = _stacks(run, tmp_path)
        assert code == 0
        frames = _training(answer, 0)
        assert frames[-1].func == "wait_for_lost_shard" and frames[-1].file.endswith("train.py")
        assert frames[-2].code == "wait_for_lost_shard()"
        assert "rank 0 was in `wait_for_lost_shard` (train.py:" in answer["summary"]
        text = ptdash("ctl", str(run.run_dir), "stacks", cwd=tmp_path, timeout=60)
        assert text.returncode == 0, text.stderr
        assert "wait_for_lost_shard  train.py:" in text.stdout and "ptdash-flush" in text.stdout
        doctor = ptdash("doctor", str(run.run_dir), cwd=tmp_path, timeout=60)
        assert "stalled" in doctor.stdout and "rank 0 was in `wait_for_lost_shard` (train.py:" in doctor.stdout
    finally:
        run.close()


def test_one_process_holding_the_gil_in_c_is_named_with_its_proc_state(tmp_path):
    run = _start(tmp_path, "gil", rank=0, at=5)
    try:
        run.wait_step(1)
        code, answer = wait_for(lambda: (found := _stacks(run, tmp_path, "--timeout", "3"))[0] == 1 and found, 120,
                                what="no answer from the engine")
        (rank,) = read(answer["ranks"])
        assert not rank.answered and "did not answer" in rank.note and rank.state.startswith("R"), rank
    finally:
        run.close()


CASES = {
    # hang: (what rank 1's stacks name, what rank 0 waits in)
    "python": ("rank 1 was in `wait_for_lost_shard` (train.py:", "rank 0 waited in `loss.backward()` (train.py:"),
    "data": ("rank 1 was in `for step, x in enumerate(loader, 1):` (train.py:",
             "rank 0 waited in `loss.backward()` (train.py:"),
    "collective": ("rank 1 waited in `dist.barrier()` (train.py:", "rank 0 waited in `dist.all_reduce(metric)` (train.py:"),
}


@pytest.mark.parametrize("hang", sorted(CASES))
def test_two_gloo_ranks_one_stuck_named_on_demand_and_in_the_stall(tmp_path, hang):
    run = _start(tmp_path, hang, "--nproc-per-node", "2")
    stuck, waits = CASES[hang]
    try:
        stall = wait_for(lambda: _stall(run), 180, what="the stall stored")
        assert stuck in stall.where and waits in stall.where, stall.where
        assert [r.rank for r in stall.stacks] == [0, 1]
        if hang != "collective":
            assert stall.ranks == (1,), stall  # named by its stacks: rank 0 waits for it
        else:
            assert "rank 1 made 1 fewer all_reduce than rank 0 since step 11" in stall.where, stall.where
        code, answer = _stacks(run, tmp_path)
        assert code == 0 and stuck in answer["summary"] and waits in answer["summary"], answer["summary"]
        inner = {"python": "wait_for_lost_shard", "data": "_try_get_data", "collective": "barrier"}[hang]
        assert inner in [f.func for f in _training(answer, 1)]
        text = ptdash("stacks", str(run.run_dir), cwd=tmp_path, timeout=60)
        assert "ranks differ here:" in text.stdout and "▶" in text.stdout, text.stdout
        doctor = ptdash("doctor", str(run.run_dir), cwd=tmp_path, timeout=60)
        assert stuck in doctor.stdout.replace("\n        ", " "), doctor.stdout
        if hang == "python":  # DDP's gradient all-reduce, which the script never calls, waits for rank 1
            behind = ("rank 1 is at collective {} (gloo:all_reduce, 1 element, completed) of group 0 (default_pg); "
                      "rank 0 at collective {} (gloo:all_reduce, 161 elements, scheduled)")
            (one,) = [r for r in read(answer["ranks"]) if r.rank == 1]
            seq = one.flight.entries[-1].seq
            assert behind.format(seq, seq + 1) in answer["summary"] and behind.format(seq, seq + 1) in stall.where
            assert f"group 0 #{seq + 1}  gloo:all_reduce  [161]  Float  scheduled" in text.stdout, text.stdout
            asyncio.run(_k_in_the_dashboard(run))
    finally:
        run.close()


async def _k_in_the_dashboard(run: Run) -> None:
    """``k`` asks the live run: the stacks screen shows the answer (not the stall's), both ranks side by
    side; closed, the Ranks tab under it shows the same."""
    app = make_app(LiveSource(run.run_dir), redraw_hz=10)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: app.source.can_control and app.state.world_size == 2, what="connected")
        await until(pilot, lambda: app.state.stacks is not None, what="the stall's stacks from the history")
        await pilot.press("k")
        await until(pilot, lambda: "Stacks asked for at" in screen_text(app), timeout=60, what="the answer drawn")
        text = screen_text(app)
        assert "rank 1 was in `wait_for_lost_shard` (train.py:" in text and "ranks differ here:" in text, text
        assert "▶ <module>  train.py:" in text
        await pilot.press("escape")
        await until(pilot, lambda: "stacks asked for at" in screen_text(app), what="the Ranks tab under it")
        assert app.query_one("TabbedContent").active == "ranks"
        assert "ranks differ here:" in screen_text(app)


def test_a_rank_that_skipped_a_ddp_step_is_named_by_the_flight_recorder(tmp_path):
    """Rank 1 skips step 12 (no labelled example): its DDP backward all-reduces are one behind
    rank 0's, unseen until the end, where it waits in the final barrier and rank 0 in its last
    backward. The script's named calls cannot say why; the process group's recorder can."""
    shutil.copy(SCRIPTS / "ddp_skip.py", tmp_path / "train.py")
    run = Run(tmp_path, "train.py", "--steps", "20", "--at", "12",
              options=("--stall-timeout", "3", "--nproc-per-node", "2"))
    waits = ("rank 0 waited in `loss.backward()` (train.py:", "rank 1 waited in `dist.barrier()` (train.py:")
    differ = ("of group 0 (default_pg) is not the same on every rank: rank 0 gloo:all_reduce, 178 elements, "
              "scheduled; rank 1 gloo:barrier, scheduled")
    try:
        stall = wait_for(lambda: _stall(run), 180, what="the stall stored")
        assert all(w in stall.where for w in waits) and differ in stall.where, stall.where
        code, answer = _stacks(run, tmp_path)
        assert code == 0 and all(w in answer["summary"] for w in waits) and differ in answer["summary"]
        zero, one = read(answer["ranks"])
        assert zero.flight.entries[-1].seq == one.flight.entries[-1].seq
        assert (zero.flight.entries[-1].op, one.flight.entries[-1].op) == ("gloo:all_reduce", "gloo:barrier")
        assert sum(e.op == "gloo:all_reduce" for e in one.flight.entries) >= 6  # the reducer's, none by name
        assert "all_reduce" not in zero.collectives
        doctor = ptdash("doctor", str(run.run_dir), cwd=tmp_path, timeout=60)
        assert differ in doctor.stdout.replace("\n        ", " "), doctor.stdout
    finally:
        run.close()


def test_a_rank_that_cannot_answer_is_named_with_its_last_step_and_proc_state(tmp_path):
    run = _start(tmp_path, "none", "--nproc-per-node", "2")
    try:
        wait_for(lambda: run.last_step(1) >= 5, 180, what="rank 1 stepping")
        rank1 = rank_pid(tmp_path, 1)
        os.kill(rank1, signal.SIGSTOP)
        try:
            code, answer = _stacks(run, tmp_path)
        finally:
            os.kill(rank1, signal.SIGCONT)
        assert code == 1
        zero, one = read(answer["ranks"])
        assert zero.answered and not one.answered and one.pid == rank1
        assert one.state.startswith("T") and "stopped" in one.note and one.step >= 5, one
    finally:
        run.close()


def test_a_rank_holding_its_gil_is_named_at_the_step_the_run_stands_by_its_last_report(tmp_path):
    # Rank 1 runs a backtracking regex (C, the GIL held) in step 10: its engine cannot flush
    # or answer, so the hub last heard of it some steps before; rank 0 waits in step 10's
    # backward, having made step 9. The stall is at step 9, not at rank 1's last report, and
    # rank 1's step is said as its last report.
    run = _start(tmp_path, "gil", "--nproc-per-node", "2", at=10)
    try:
        stall = wait_for(lambda: _stall(run), 180, what="the stall stored")
        assert stall.step == 9 == run.last_step(0) and stall.ranks == (1,), stall
        (silent,) = [r for r in stall.stacks if not r.answered]
        assert silent.rank == 1 and silent.state.startswith("R") and silent.step <= 9, silent
        said = run.info().stalled
        assert re.match(r"rank 1 stalled: no step (for \d+ s \(at step 9\)|reported for \d+ s \(the last at step "
                        rf"{silent.step}\)); the others wait for it at step 9", said), said
        assert f"rank 1: its interpreter did not answer; process R (running) (last reported step {silent.step})" \
            in stall.where and "rank 0 waited in `loss.backward()` (train.py:" in stall.where, stall.where
        doctor = ptdash("doctor", str(run.run_dir), cwd=tmp_path, timeout=60)
        assert doctor.stdout.startswith("ptdash doctor: run (stalled at step 9)"), doctor.stdout
    finally:
        run.close()
