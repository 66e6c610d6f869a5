"""GPU-only checks: skipped without CUDA, run on a GPU machine whenever one is available."""

import pytest
import torch

from ptdash.shared.reader import StoreReader
from support.runner import SCRIPTS, ptdash

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_training_loop_under_the_engine_adds_no_host_sync(tmp_path):
    # torch.cuda.set_sync_debug_mode("error") is process-wide: a sync from our hooks (training
    # thread) would crash the script, one from the flusher would be logged as a failed flush.
    result = ptdash("--headless", "--run-dir", "run", "--clip", "0.5", str(SCRIPTS / "cuda_sync_free.py"),
                    cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "SYNC-FREE OK" in result.stdout
    engine_log = (tmp_path / "run" / "engine.log").read_text()
    assert "flush failed" not in engine_log, engine_log
    with StoreReader(tmp_path / "run" / "metrics.db") as s:
        steps, losses = s.series("loss")
        _, norms = s.series("grad/norm_total")
        _, mem = s.sampled("gpu0/mem_allocated_bytes")  # sampled by time, not by step
        layers = s.layers()
    assert steps == list(range(1, 301)) and all(v is not None for v in losses + norms)
    assert mem and max(mem) > 0
    assert layers


def test_nonfinite_gradient_on_cuda_pauses_at_the_next_flush(tmp_path):
    from support.runner import Run, wait_for

    run = Run(tmp_path, SCRIPTS / "cuda_plant_nan.py")
    try:
        wait_for(lambda: run.info().status == "paused", 60, what="the deferred anomaly pause")
        with run.store() as s:
            messages = [e.message for e in s.events() if e.kind == "anomaly"]
        assert any("seen at the flush" in m for m in messages), messages
        assert run.info().step < 100  # paused within a flush or two of step 20
    finally:
        run.close()


def test_rollback_snapshots_add_no_host_sync(tmp_path):
    # The refreshes run on the training thread under set_sync_debug_mode("error"): a sync raises.
    result = ptdash("--headless", "--run-dir", "run", "--on-anomaly", "rollback", "--rollback-every", "10",
                    str(SCRIPTS / "cuda_sync_free.py"), cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "SYNC-FREE OK" in result.stdout
    assert "flush failed" not in (tmp_path / "run" / "engine.log").read_text()
    with StoreReader(tmp_path / "run" / "metrics.db") as s:
        kept = [e for e in s.events() if e.kind == "snapshot"]
        rolled = [e for e in s.events() if e.kind == "rollback"]
    assert kept and "(two copies)" in kept[0].message and not rolled


def test_a_wild_batch_on_cuda_is_rolled_back_after_the_flush_that_saw_it(tmp_path):
    import re

    result = ptdash("--headless", "--run-dir", "run", "--on-anomaly", "rollback", "--rollback-every", "20",
                    str(SCRIPTS / "cuda_wild.py"), cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:]
    found = re.search(r"final loss (\S+) params finite (True|False)", result.stdout)
    assert found and found.group(2) == "True" and float(found.group(1)) < 1.0, result.stdout[-3000:]
    with StoreReader(tmp_path / "run" / "metrics.db") as s:
        (event,) = [e for e in s.events() if e.kind == "rollback"]
    assert event.data["from_step"] == 101 and event.data["to_step"] <= 100 < event.data["step"]
    # One judge: the rollback is the bad step's one event, nothing reports it again.
    with StoreReader(tmp_path / "run" / "metrics.db") as s:
        assert [e.message for e in s.events() if e.kind == "anomaly"] == []
    assert event.data["undone"] == event.data["skipped"] - 1 >= 0
    assert "seen at the flush" in event.message


def test_a_wild_batch_on_cuda_pauses_the_default_run_at_the_flush_and_says_its_update_was_applied(tmp_path):
    from support.runner import Run, wait_for

    run = Run(tmp_path, SCRIPTS / "cuda_wild.py")
    try:
        wait_for(lambda: run.info().status in ("paused", "finished"), 120, what="the deferred anomaly pause")
        with run.store() as s:
            events = [e for e in s.events() if e.kind in ("anomaly", "rollback")]
        assert len(events) == 1, [e.message for e in events]
        (event,) = events
        assert event.data["step"] == 101 and event.data["applied"] is True and event.data["action"] == "pause"
        assert "loss spike at step 101" in event.message and "its update was applied" in event.message
        # The script's 600 steps may all be over before the first flush (the H200 ran 750 a
        # second, its first flush at step 460): then there is no step left to pause at.
        if run.info().status == "paused":
            assert run.info().paused_at >= 101 and "pausing at the next step" in event.message
    finally:
        run.close()


def test_a_cuda_snapshot_restores_bit_identically():
    from ptdash.snapshot import Snapshot, side_sources

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32), torch.nn.Linear(32, 1)).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=50)

    def train(n, scale=1.0):
        for _ in range(n):
            x = torch.randn(64, 16, device="cuda") * scale
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()

    train(3)
    expected = ({k: v.clone() for k, v in model.state_dict().items()},
                {i: {k: v.clone() for k, v in s.items()} for i, s in opt.state_dict()["state"].items()},
                sched.state_dict())
    snap, stream = Snapshot(), torch.cuda.Stream()
    structure, sources = Snapshot.gather([model], [opt], [sched], [])
    torch.cuda.set_sync_debug_mode("error")
    try:
        snap.take(3, structure, sources, stream, side_sources([model], structure, sources))
        snap.fence()
        train(3, scale=1e4)  # the next updates run while (or after) the copies land
    finally:
        torch.cuda.set_sync_debug_mode(0)
    snap.done.synchronize()
    snap.restore([model], [opt], [sched], [])
    torch.cuda.synchronize()
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in expected[0].items())
    state = opt.state_dict()["state"]
    assert all(torch.equal(v, state[i][k].to(v.device)) for i, s in expected[1].items() for k, v in s.items())
    assert sched.state_dict() == expected[2]


@pytest.mark.skipif(not torch.distributed.is_nccl_available(), reason="needs NCCL")
def test_stacks_read_the_nccl_flight_recorder(tmp_path):
    """NCCL's process groups keep a flight recorder of their own: a take reads it beside the frames."""
    import json

    from ptdash.shared.stacks import read
    from support.runner import Run, wait_for

    hold = tmp_path / "hold"
    hold.touch()
    run = Run(tmp_path, SCRIPTS / "nccl_one_rank.py", "--hold", str(hold), "--at", "10")
    try:
        wait_for(lambda: "holding" in (tmp_path / "cli.out").read_text() or run.proc.poll() is not None, 120,
                 what="the script to hold at step 10")
        done = ptdash("stacks", str(run.run_dir), "--json", cwd=tmp_path, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        (rank,) = read(json.loads(done.stdout)["ranks"])
        entries = rank.flight.entries
        assert rank.flight.note == "" and entries, rank.flight
        assert all(e.op.startswith("nccl:") for e in entries), entries
        last = entries[-1]
        assert (last.op, last.sizes, last.dtypes) == ("nccl:all_reduce", ((25,),), ("Float",)), entries
        assert sum(e.op == "nccl:all_reduce" and e.sizes != ((25,),) for e in entries) >= 2  # DDP's reducer's
        assert any(c.group == last.group and c.enqueued == last.seq for c in rank.flight.groups), rank.flight.groups
    finally:
        hold.unlink(missing_ok=True)
        wait_for(lambda: run.proc.poll() is not None, 120, what="the run to end")
        run.close()
    assert "NCCL OK" in (tmp_path / "cli.out").read_text()


def test_the_gpu_overhead_benchmark_runs_and_ptdash_changes_no_loss():
    import subprocess
    import sys

    from support.runner import ENV, REPO

    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_overhead.py"), "--rounds", "1", "--steps",
                           "50", "--layers", "2", "--clip"], capture_output=True, text=True, timeout=600, env=ENV)
    assert done.returncode == 0, done.stdout + done.stderr
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("ptdash / plain:")]
    plain, under = line.split("plain [")[1].split("]")[0], line.split("ptdash [")[1].split("]")[0]
    assert plain == under and "," not in plain, line  # one final loss, the same plain and under ptdash
