"""``--on-anomaly rollback`` through the real CLI, on an unmodified script (argparse, a
DataLoader, SGD with momentum, a cosine schedule) with one bad batch."""

import re
import subprocess
import sys

import pytest

from support.runner import ENV, SCRIPTS, ptdash

WILD = SCRIPTS / "wild_batch.py"


def _events(run_dir, kind):
    from ptdash.shared.reader import StoreReader
    with StoreReader(run_dir / "metrics.db") as s:
        return [e for e in s.events() if e.kind == kind]


def _final(output: str) -> tuple[float, bool]:
    found = re.search(r"final loss (\S+) params finite (True|False)", output)
    assert found, output[-2000:]
    return float(found.group(1)), found.group(2) == "True"


@pytest.mark.parametrize("bad", ["wild", "inf"])
def test_plain_python_ends_ruined(tmp_path, bad):
    result = subprocess.run([sys.executable, str(WILD), "--bad", bad], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120, env=ENV)
    assert result.returncode == 0, result.stderr
    loss, finite = _final(result.stdout)
    assert loss != loss and not finite  # NaN for good, from the bad batch on


@pytest.mark.parametrize("bad", ["wild", "inf"])
def test_a_bad_batch_is_rolled_back_and_the_run_ends_healthy(tmp_path, bad):
    result = ptdash("--headless", "--run-dir", "run", "--on-anomaly", "rollback", "--rollback-every", "10",
                    str(WILD), "--bad", bad, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:]
    loss, finite = _final(result.stdout)
    assert finite and loss < 0.05, result.stdout[-3000:]
    (event,) = _events(tmp_path / "run", "rollback")
    data = event.data
    # Batch 80 is step 81; the snapshot of step 80 was taken before it, at the end of step 80.
    assert data["from_step"] == 81 and data["step"] == 81 and data["to_step"] == 80 and data["skipped"] == 1
    assert ("loss spike" if bad == "wild" else "non-finite") in data["why"]
    assert "rolled back to step 80, 1 batch skipped" in event.message
    assert "rolled back to step 80" in result.stdout  # the headless front shows it
    (kept,) = _events(tmp_path / "run", "snapshot")
    assert kept.data["bytes"] > 0 and kept.data["every"] == 10


def test_a_healthy_run_is_never_rolled_back(tmp_path):
    result = ptdash("--headless", "--run-dir", "run", "--on-anomaly", "rollback", str(WILD), "--bad", "none",
                    cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:]
    assert _events(tmp_path / "run", "rollback") == []
    assert _events(tmp_path / "run", "snapshot")  # snapshots were kept all along


def test_the_lr_is_lowered_for_a_while_and_too_many_rollbacks_stop_an_unattended_run(tmp_path):
    result = ptdash("--headless", "--run-dir", "run", "--on-anomaly", "rollback", "--rollback-every", "10",
                    "--rollback-lr", "0.5:30", "--rollback-limit", "1:1000",
                    str(WILD), "--at", "60", "120", "--steps", "300", cwd=tmp_path)
    events = _events(tmp_path / "run", "rollback")
    first, back, second, limit = events[:4]
    assert first.data["step"] == 61 and first.data["lr_scale"] == 0.5
    assert back.data["lr_scale"] == 1.0 and back.step == 91
    assert second.data["step"] == 121 and second.data["to_step"] == 120
    # No terminal: a pause would only time out, so it stops (with a checkpoint of the good state).
    assert limit.data["limit"] == 1 and limit.data["action"] == "stop"
    from ptdash.shared import rundir
    assert rundir.read_info(tmp_path / "run").status == "stopped", result.stdout[-2000:]


def test_two_ddp_ranks_roll_back_together_and_stay_identical(tmp_path):
    import torch

    result = ptdash("--headless", "--run-dir", "run", "--nproc-per-node", "2", "--on-anomaly", "rollback",
                    "--rollback-every", "10", str(SCRIPTS / "ddp_wild.py"), cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:]
    events = _events(tmp_path / "run", "rollback")
    by_rank = {e.rank: e for e in events}
    assert sorted(by_rank) == [0, 1] and len(events) == 2, [(e.rank, e.message) for e in events]
    zero, one = by_rank[0].data, by_rank[1].data
    # Rank 1's wild batch (step 71): its loss spikes there, and the gradient norm on both ranks
    # (DDP averaged the gradients); both ranks roll back at the same exchange, to the same step, once.
    assert zero == one, (zero, one)
    assert zero["from_step"] == 71 and zero["to_step"] <= 70 < zero["step"]
    assert re.match(r"rank [01]: (loss|gradient norm) spike", zero["why"])
    params = [torch.load(tmp_path / f"params-{r}.pt") for r in (0, 1)]
    assert all(torch.equal(params[0][k], params[1][k]) for k in params[0])
    for r in (0, 1):  # from a file each: the ranks' lines can interleave in the output
        assert float((tmp_path / f"final-{r}.txt").read_text()) < 0.05, result.stdout[-3000:]


def _ctl(run, *words):
    import json

    out = subprocess.run([sys.executable, "-m", "ptdash.tui.cli", "ctl", str(run.run_dir), *words, "--json"],
                         capture_output=True, text=True, timeout=120, env=ENV, stdin=subprocess.DEVNULL)
    return out.returncode, json.loads(out.stdout)


def test_ctl_rollback_in_an_anomaly_pause_puts_the_good_state_back_and_resumes(tmp_path):
    from support.runner import Run, wait_for

    run = Run(tmp_path, WILD, "--bad", "inf", options=("--on-anomaly", "pause", "--rollback-every", "10"))
    try:
        wait_for(lambda: run.info().status == "paused", 60, what="the anomaly pause")
        code, answer = _ctl(run, "rollback")
        assert code == 0 and answer["ok"], answer
        assert answer["message"] == "rolled back to step 80; resumed at step 80"
        assert run.wait() == 0
        loss, finite = _final(run.output())
        assert finite and loss < 0.05
        (event,) = _events(run.run_dir, "rollback")
        assert event.data["to_step"] == 80 and event.data["why"] == "a rollback asked for"
    finally:
        run.close()


def test_ctl_rollback_on_a_run_that_keeps_no_snapshot_is_refused_with_the_reason(tmp_path):
    from support.runner import Run, wait_for

    run = Run(tmp_path, SCRIPTS / "plant_nan.py")
    try:
        wait_for(lambda: run.info().status == "paused", 60, what="the anomaly pause")
        code, answer = _ctl(run, "rollback")
        assert code == 1 and not answer["ok"]
        assert "keeps no snapshot to roll back to" in answer["message"] and "--rollback-every" in answer["message"]
        assert run.info().status == "paused"  # nothing changed
        assert run.send("resume").ok
        assert run.wait() == 0
    finally:
        run.close()
