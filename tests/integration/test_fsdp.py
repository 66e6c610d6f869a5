"""Sharded models on two gloo ranks through the real CLI: FSDP2 (``fully_shard``) and FSDP1
(``FullyShardedDataParallel``) record every step on every rank, take a live clip at one
step on both, and checkpoint and resume through torch.distributed.checkpoint."""

from __future__ import annotations

import subprocess
import sys

import pytest

from support.runner import ENV, SCRIPTS, ptdash

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


@pytest.mark.parametrize("clip", [True, False], ids=["clip", "no-clip"])
def test_fsdp2_records_every_step_on_both_ranks_with_losses_identical_to_plain(tmp_path, clip):
    args = ("--wrap", "fsdp2", "--steps", "12", "--checkpointing", *(("--clip", "0.5") if clip else ()))
    plain = _plain(tmp_path, *args)
    done = _under_ptdash(tmp_path, *args)
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
