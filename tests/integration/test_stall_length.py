"""A stall's whole length, through the real CLI: journaled when it ends, said by ``ptdash doctor``
and ``ptdash show --once``, and known for a run that ended or was killed while stalled.

tests/scripts/hangs.py spins in Python for a known span (``--for``) at a chosen step, longer than
a small ``--stall-timeout``. Every check of a length is a bound the machine's speed cannot break:
at least the span slept (not the timeout at which the stall was named), and exactly the steps'
own end times around it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time

import pytest

from ptdash.shared import events, rundir
from support.runner import SCRIPTS, Run, engine_pid, ptdash, wait_for

pytestmark = pytest.mark.slow

SPIN = 10.0
"""Seconds the stuck rank spins: more than three stall timeouts."""

FOR = re.compile(r"was in `wait_for_lost_shard` \(train\.py:\d+\) for (\d+) s(.*)")


def _stalls(run: Run) -> list[events.Stall]:
    with run.store() as s:
        return [w for e in s.events() if isinstance(w := events.read(e), events.Stall)]


def _named(run: Run) -> events.Stall | None:
    return next((s for s in _stalls(run) if not s.ended and "wait_for_lost_shard" in s.where), None)


def _start(tmp_path, *args: str, options: tuple = ()) -> Run:
    shutil.copy(SCRIPTS / "hangs.py", tmp_path / "train.py")
    return Run(tmp_path, "train.py", "--hang", "python", "--sleep", "0.05", *args, options=options)


def _doctor(run: Run, tmp_path) -> tuple[int, str, dict]:
    """The seconds the doctor's stall finding gives, the rest of its sentence, and its JSON finding."""
    text = ptdash("doctor", str(run.run_dir), cwd=tmp_path, timeout=60).stdout.replace("\n        ", " ")
    found = FOR.search(text)
    assert found, text
    answer = json.loads(ptdash("doctor", str(run.run_dir), "--json", cwd=tmp_path, timeout=60).stdout)
    (stalled,) = [f for f in answer["findings"] if f["id"] == "stalled"]
    return int(found.group(1)), found.group(2), stalled


@pytest.mark.parametrize("nproc", [1, 2], ids=["one-process", "two-gloo-ranks"])
def test_a_stall_that_ends_says_its_whole_length(tmp_path, nproc):
    stuck = nproc - 1  # one process: rank 0; two ranks: rank 1 while rank 0 waits in backward
    run = _start(tmp_path, "--at", "8", "--rank", str(stuck), "--for", str(SPIN), "--steps", "14",
                 options=("--stall-timeout", "3", *(("--nproc-per-node", "2") if nproc > 1 else ())))
    assert run.wait(300) == 0, run.output()
    named = _named(run)
    assert named is not None and named.step == 7, _stalls(run)
    (end,) = [s for s in _stalls(run) if s.ended and s.step == 7]
    assert end.seconds >= SPIN and not end.with_run, end  # the whole stall, not the timeout it was named at
    assert named.seconds < end.seconds and end.started == named.started
    # From the newest step before it to the first step after it, by the steps' own times.
    walls = [run.walls(rank) for rank in range(nproc)]
    assert end.started == pytest.approx(max(w[7] for w in walls))
    assert min(w[8] for w in walls) - 1e-6 <= end.started + end.seconds <= max(w[8] for w in walls) + 1e-6

    seconds, rest, stalled = _doctor(run, tmp_path)
    assert seconds >= SPIN and rest.split(";")[0] == "", rest  # no "so far": the whole stall
    assert stalled["extra"]["over"] and stalled["extra"]["seconds"] == pytest.approx(end.seconds, abs=1e-3)
    if nproc > 1:
        assert "rank 1 was in `wait_for_lost_shard`" in stalled["what"]
        assert "rank 0 waited in `loss.backward()` (train.py:" in stalled["what"], stalled
    shown = ptdash("show", str(run.run_dir), "--once", cwd=tmp_path, timeout=60).stdout
    assert re.search(rf"stalls\s+step 7: {seconds}s\n", shown), shown


@pytest.mark.parametrize("how,nproc", [("ctl-kill", 1), ("sigkill", 1), ("ctl-kill", 2)],
                         ids=["ctl-kill", "sigkill", "ctl-kill-two-gloo-ranks"])
def test_a_run_killed_while_stalled_says_how_long_it_had_stalled(tmp_path, how, nproc):
    run = _start(tmp_path, "--at", "5", "--rank", str(nproc - 1),
                 options=("--stall-timeout", "2", *(("--nproc-per-node", "2") if nproc > 1 else ())))
    try:
        named = wait_for(lambda: _named(run), 120, what="the stall named")
        asked = time.time()
        seconds, rest, stalled = _doctor(run, tmp_path)  # live: how long so far
        assert rest.split(";")[0] == " so far" and seconds >= int(asked - named.started), rest
        assert not stalled["extra"]["over"]
        time.sleep(3)  # stalled a while longer than when it was named
        killed = time.time()
        if how == "ctl-kill":
            assert ptdash("ctl", str(run.run_dir), "kill", cwd=tmp_path, timeout=60).returncode == 0
        else:  # from outside: the engine cannot say anything; the CLI that started it records its end
            os.kill(engine_pid(run.run_dir), signal.SIGKILL)
        run.proc.wait(60)
    finally:
        run.close()
    info = rundir.read_info(run.run_dir)
    assert info.status == "crashed" and info.ended is not None and info.ended >= killed
    assert not [s for s in _stalls(run) if s.ended]  # killed: the engine could not end it
    seconds, rest, stalled = _doctor(run, tmp_path)
    assert rest.split(";")[0] == "" and rest.endswith("; the run ended while stalled"), rest
    if nproc > 1:
        assert "rank 0 waited in `loss.backward()` (train.py:" in rest, rest
    assert int(killed - named.started) <= seconds <= info.ended - named.started + 1
    assert stalled["extra"] == {"seconds": pytest.approx(info.ended - named.started, abs=1e-3), "over": True,
                                "with_run": True}
    shown = ptdash("show", str(run.run_dir), "--once", cwd=tmp_path, timeout=60).stdout
    assert re.search(rf"stalls\s+step 4: {seconds}s \(the run ended while stalled\)", shown), shown


def test_a_run_that_ends_while_stalled_journals_the_stall_s_end(tmp_path):
    """The script gives up while stalled (it raises): the engine ends the stall with the run."""
    run = _start(tmp_path, "--at", "5", "--rank", "0", "--for", str(SPIN), "--then", "raise",
                 options=("--stall-timeout", "3"))
    assert run.wait(300) != 0
    named = _named(run)
    (end,) = [s for s in _stalls(run) if s.ended]
    assert named is not None and end.with_run and end.step == named.step == 4 and end.seconds >= SPIN, end
    seconds, rest, _ = _doctor(run, tmp_path)
    assert seconds >= SPIN and rest.startswith("; the run ended while stalled"), rest
