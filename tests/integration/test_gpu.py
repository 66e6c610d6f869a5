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
        _, mem = s.series("gpu0/mem_allocated_bytes")
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
