"""The one anomaly judge through the real CLI (issue 44 items 1-4, issue 41 item 7): healthy
runs of awkward kinds raise no alarm; one wild batch (finite x1e4, inf, NaN) makes exactly one
event, acted on before its update; a rollback goes to the newest snapshot before the bad step.

Run this file on every change of the judge (engine/judge.py, engine/spikes.py, anomalies.py,
rollback.py)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from support.runner import ENV, SCRIPTS, Run, ptdash, wait_for

ADAM = SCRIPTS / "adam_wild.py"


def _events(run_dir, *kinds):
    from ptdash.shared.reader import StoreReader
    with StoreReader(run_dir / "metrics.db") as s:
        return [e for e in s.events() if e.kind in kinds]


def _final(output: str) -> tuple[float, bool]:
    found = re.search(r"final loss (\S+) params finite (True|False)", output)
    assert found, output[-3000:]
    return float(found.group(1)), found.group(2) == "True"


def _clean_final(tmp_path) -> float:
    result = subprocess.run([sys.executable, str(ADAM), "--bad", "none", "--workers", "0"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=300, env=ENV)
    assert result.returncode == 0, result.stderr
    return _final(result.stdout)[0]


# ------------------------------------------------------------------ healthy runs: no alarm

HEALTHY = {
    "sac": (SCRIPTS / "sac_like.py", ("--updates", "500"), ()),
    "wgan-gp": (SCRIPTS / "wgan_gp.py", ("--iters", "200"), ()),
    "ppo-ddp": (SCRIPTS / "ppo_ddp.py", ("--updates", "16"), ("--nproc-per-node", "2")),
    "fsdp2": (SCRIPTS / "fsdp_train.py", ("--wrap", "fsdp2", "--steps", "120"), ("--nproc-per-node", "2")),
    "warm-up": (SCRIPTS / "realistic" / "onecycle.py", ("--epochs", "3"), ()),
    "rollback-kept": (SCRIPTS / "sac_like.py", ("--updates", "300"), ("--on-anomaly", "rollback")),
}


@pytest.mark.parametrize("kind", list(HEALTHY))
def test_a_healthy_run_raises_no_alarm(tmp_path, kind):
    script, args, options = HEALTHY[kind]
    result = ptdash("--headless", "--run-dir", "run", *options, str(script), *args, cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:]
    said = _events(tmp_path / "run", "anomaly", "rollback")
    assert said == [], [e.message for e in said]
    # Nor a vanishing gradient from a rank's empty shard (FSDP2's Linear(16, 1) on rank 1).
    assert not [e.message for e in _events(tmp_path / "run", "warning") if "vanishing" in e.message
                and e.rank == 1], kind


# ------------------------------------------------------------- wild batches: one event each

@pytest.mark.parametrize("bad", ["wild", "inf", "nan"])
def test_a_wild_batch_is_one_event_and_its_update_is_skipped_before_it_is_applied(tmp_path, bad):
    result = ptdash("--headless", "--run-dir", "run", "--on-anomaly", "skip", str(ADAM), "--bad", bad,
                    "--workers", "0", cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:]
    (event,) = _events(tmp_path / "run", "anomaly", "rollback")
    # Batch 150 is step 151: judged before its update, which was never applied.
    assert event.kind == "anomaly" and event.data["step"] == 151 and event.data["action"] == "skip"
    assert event.message.endswith("update skipped"), event.message
    assert ("loss spike at step 151" if bad == "wild" else "non-finite") in event.message
    loss, finite = _final(result.stdout)
    assert finite and loss < 3 * _clean_final(tmp_path) + 1e-3, result.stdout[-2000:]


def test_the_default_run_pauses_before_the_wild_update_and_a_resume_skips_it(tmp_path):
    run = Run(tmp_path, ADAM, "--sleep", "0.005", "--workers", "0")
    try:
        wait_for(lambda: run.info().status == "paused", 120, what="the anomaly pause")
        assert run.info().paused_at == 150  # before the update of step 151
        (event,) = wait_for(lambda: _events(run.run_dir, "anomaly"), 30, what="the anomaly event")
        assert event.data["step"] == 151 and event.data["action"] == "pause" and not event.data.get("applied")
        assert "paused before the update, which a resume skips" in event.message
        assert run.send("resume").ok
        assert run.wait(300) == 0
    finally:
        run.close()
    loss, finite = _final(run.output())
    assert finite and loss < 3 * _clean_final(tmp_path) + 1e-3
    assert len(_events(run.run_dir, "anomaly", "rollback")) == 1


def test_under_rollback_one_rollback_event_and_no_second_report(tmp_path):
    result = ptdash("--headless", "--run-dir", "run", "--on-anomaly", "rollback", "--rollback-every", "22",
                    str(SCRIPTS / "wild_batch.py"), "--at", "79", cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:]
    (event,) = _events(tmp_path / "run", "anomaly", "rollback")
    data = event.data
    # Batch 79 is step 80; snapshots at 22, 44, 66: the newest before the bad step is 66.
    assert event.kind == "rollback" and data["from_step"] == 80 and data["to_step"] == 66
    assert data["skipped"] == 14 and data["undone"] == 13
    assert "rolled back to step 66, 14 batches skipped (13 applied updates undone)" in event.message
    loss, finite = _final(result.stdout)
    assert finite and loss < 0.05


def test_rollback_kept_off_pauses_a_finite_spike_before_its_update(tmp_path):
    """Issue 41 item 7: '--rollback-memory 1K' keeps no snapshot; the promised pause happens."""
    run = Run(tmp_path, ADAM, "--sleep", "0.005", "--workers", "0",
              options=("--on-anomaly", "rollback", "--rollback-memory", "1K"))
    try:
        wait_for(lambda: run.info().status == "paused", 120, what="the pause rollback-off promises")
        assert run.info().paused_at == 150
        off = [e.message for e in _events(run.run_dir, "warning") if e.message.startswith("rollback off")]
        assert off and "an anomaly pauses the run instead" in off[0]
        (event,) = _events(run.run_dir, "anomaly", "rollback")
        assert event.data["action"] == "pause" and "loss spike at step 151" in event.message
        assert run.send("resume").ok
        assert run.wait(300) == 0
    finally:
        run.close()
    loss, finite = _final(run.output())
    assert finite and loss < 3 * _clean_final(tmp_path) + 1e-3


def test_an_lr_jump_the_user_made_raises_no_alarm(tmp_path):
    run = Run(tmp_path, ADAM, "--bad", "none", "--sleep", "0.01", "--workers", "0")
    try:
        run.wait_step(120, timeout=120)
        ack = run.send("lr_scale", 10.0)  # Adam 3e-3 -> 3e-2 on a converged loss: it rises
        assert ack.ok, ack
        assert run.wait(300) == 0
    finally:
        run.close()
    said = _events(run.run_dir, "anomaly", "rollback")
    assert said == [], [e.message for e in said]
    with run.store() as s:
        steps, losses = s.series("loss")
    before = sorted(v for st, v in zip(steps, losses) if 100 <= st <= ack.step)
    after = max(v for st, v in zip(steps, losses) if ack.step < st <= ack.step + 30)
    assert after > 3 * before[len(before) // 2], (after, before[len(before) // 2])  # it did rise
