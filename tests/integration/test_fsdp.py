"""Sharded models on two gloo ranks through the real CLI: FSDP2 (``fully_shard``) and FSDP1
(``FullyShardedDataParallel``) record every step on every rank, take a live clip at one
step on both, and checkpoint and resume through torch.distributed.checkpoint."""

from __future__ import annotations

import subprocess
import sys

import pytest

from support.runner import ENV, SCRIPTS, Run, ptdash, wait_for

FSDP = SCRIPTS / "fsdp_train.py"
pytestmark = pytest.mark.slow


def _plain(tmp_path, *args: str) -> dict[int, list[str]]:
    """The script's losses per rank under torch's own launcher, without ptdash."""
    where = tmp_path / "plain"
    where.mkdir()
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                    str(FSDP), *args], cwd=where, env=ENV, check=True, capture_output=True, timeout=300)
    return _losses(where)


def _losses(where) -> dict[int, list[str]]:
    return {r: (where / f"losses-{r}.txt").read_text().splitlines() for r in (0, 1)}


def _under_ptdash(tmp_path, *args: str, options: tuple = ()) -> subprocess.CompletedProcess:
    where = tmp_path / "ptdash"
    where.mkdir(exist_ok=True)
    return ptdash("--headless", "--nproc-per-node", "2", "--run-dir", str(where / "run"), *options, str(FSDP),
                  *args, cwd=where, timeout=300)


def _clean(text: str) -> None:
    """No ptdash traceback, no failed flush, every rank linked to the hub."""
    assert "Traceback" not in text and "runs without ptdash" not in text and "flush" not in text, text[-3000:]


@pytest.mark.parametrize("wrap,clip", [("fsdp2", True), ("fsdp2", False), ("fsdp1", True)],
                         ids=["fsdp2-clip", "fsdp2-no-clip", "fsdp1-own-clip"])
def test_fsdp_records_every_step_on_both_ranks_with_losses_identical_to_plain(tmp_path, wrap, clip):
    args = ("--wrap", wrap, "--steps", "12", "--checkpointing", *(("--clip", "0.5") if clip else ()))
    plain = _plain(tmp_path, *args)
    # FSDP1's run asks for rollback too: a snapshot cannot copy shards, so it is turned off
    # in one warning on each rank (it crashed the script's step on DTensors).
    done = _under_ptdash(tmp_path, *args, options=("--on-anomaly", "rollback") if wrap == "fsdp1" else ())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert _losses(tmp_path / "ptdash") == plain
    run = tmp_path / "ptdash" / "run"
    _clean(done.stdout + done.stderr + (run / "output.log").read_text() + (run / "engine.log").read_text())
    from ptdash.shared.reader import StoreReader

    steps = list(range(1, 13))
    with StoreReader(run / "metrics.db") as store:
        for rank in (0, 1):
            losses = store.series("loss", rank=rank)
            assert losses[0] == steps and [float.fromhex(v.split()[1]) for v in plain[rank]] == \
                pytest.approx(losses[1], rel=1e-6), rank
            assert store.series("opt/lr/group0", rank=rank)[0] == steps
            norm = store.series("grad/norm_total" if clip else "grad/norm_local", rank=rank)
            assert norm[0] == steps and all(v is not None and v > 0 for v in norm[1]), (rank, norm)
        if clip:
            # The whole model's norm, reduced across ranks: the same on both.
            assert store.series("grad/norm_total", rank=0)[1] == store.series("grad/norm_total", rank=1)[1]
            assert "grad/norm_local" not in store.names()
        else:
            assert "grad/norm_total" not in store.names()
        assert any("are shards (FSDP)" in e.message for e in store.events())
        off = [e for e in store.events() if e.message.startswith("rollback off: the model's parameters are shards")]
        assert len(off) == (2 if wrap == "fsdp1" else 0), off


@pytest.mark.parametrize("wrap", ["fsdp2", "fsdp1"])
def test_live_clip_on_both_ranks_checkpoints_on_demand_and_on_stop_and_a_bit_identical_resume(tmp_path, wrap):
    # FSDP2 without the script's clip (the live clip reduces the total itself), FSDP1 with
    # its own model.clip_grad_norm_ (the live value replaces the script's there).
    args = ("--wrap", wrap, "--checkpointing", "--sleep", "0.05", *(("--clip", "5.0") if wrap == "fsdp1" else ()))
    first = tmp_path / "first"
    first.mkdir()
    run = Run(first, FSDP, *args, options=("--nproc-per-node", "2"))
    try:
        both = lambda n: wait_for(lambda: min(run.last_step(0), run.last_step(1)) >= n, 120, what=f"step {n}")  # noqa: E731
        both(3)
        clip = run.send("clip", 0.1)  # before the checkpoint: its controls carry it to the resumed run
        assert clip.ok, clip.message
        both(clip.step + 3)
        saved = run.send("checkpoint")
        assert saved.ok and f"step-{saved.step}" in saved.message, saved.message
        both(saved.step + 3)
        stop = run.send("stop")
        assert stop.ok
        assert run.wait(120) == 0
        for rank in (0, 1):
            clip_max = run.series("grad/clip_max", rank=rank)
            first_clipped = clip_max[0][clip_max[1].index(0.1)]
            assert first_clipped == clip.step + 1, rank  # the same step on both ranks
            norms = run.series("grad/norm_total", rank=rank)
            assert set(range(clip.step + 1, stop.step + 1)) <= set(norms[0]), rank
        output = run.output()
        _clean(output + (run.run_dir / "engine.log").read_text())
    finally:
        run.close()
    checkpoints = run.run_dir / "checkpoints"
    ends = sorted(int(p.name.split("-")[1]) for p in checkpoints.glob("step-*"))
    assert ends[0] == saved.step and ends[-1] >= stop.step  # on demand, and on stop
    for end in ends:
        assert {".metadata", "ptdash.pt", "rank-0.pt", "rank-1.pt"} <= {p.name for p in (checkpoints / f"step-{end}").iterdir()}
    assert not list(checkpoints.glob(".step-*"))
    # Resumed from the on-demand checkpoint, to the step the first run stopped at: the same losses.
    stopped_at = int(_losses(first)[0][-1].split()[0])
    again = tmp_path / "again"
    again.mkdir()
    done = ptdash("--headless", "--nproc-per-node", "2", "--run-dir", str(again / "run"), "--resume",
                  str(checkpoints / f"step-{saved.step}"), str(FSDP), *args, "--steps", str(stopped_at),
                  cwd=again, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    _clean(done.stdout + done.stderr + (again / "run" / "output.log").read_text())
    before = _losses(first)
    for rank in (0, 1):
        assert _losses(again)[rank] == before[rank][saved.step:], rank
