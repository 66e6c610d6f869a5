"""Planted NaNs through the real CLI: paused before the bad update, or skipped."""


from support.runner import SCRIPTS, Run, ptdash, wait_for


def _events(run_dir):
    from ptdash.shared.reader import StoreReader
    with StoreReader(run_dir / "metrics.db") as s:
        return s.events()


def test_nan_pauses_before_the_update_and_names_the_layer(tmp_path):
    run = Run(tmp_path, SCRIPTS / "plant_nan.py")
    try:
        wait_for(lambda: run.info().status == "paused", 60, what="the anomaly pause")
        assert run.info().step == 5
        events = wait_for(lambda: [e for e in _events(run.run_dir) if e.kind == "anomaly"], 10)
        assert "non-finite gradient before the update of step 6, first in 2.weight" in events[0].message
        assert "paused before the update" in events[0].message
        # While paused the bad update has not been applied.
        assert "step 6" not in run.output()
        assert run.send("resume").ok
        assert run.wait() == 0
        assert "params finite at the end" in run.output()
        # One event for the bad step, saying what was done: the resume went on without its update.
        (event,) = [e for e in _events(run.run_dir) if e.kind == "anomaly"]
        assert "which a resume skips" in event.message
    finally:
        run.close()


def test_skip_continues_with_finite_parameters(tmp_path):
    result = ptdash("--headless", "--run-dir", "run", "--on-anomaly", "skip", str(SCRIPTS / "plant_nan.py"),
                    cwd=tmp_path)
    assert result.returncode == 0, result.stdout
    assert "params finite at the end" in result.stdout
    assert "step 6 finite True" in result.stdout
    events = [e for e in _events(tmp_path / "run") if e.kind == "anomaly"]
    assert "update skipped" in events[0].message and events[0].data["layer"] == "2.weight"


def test_warn_lets_the_nan_through(tmp_path):
    result = ptdash("--headless", "--run-dir", "run", "--on-anomaly", "warn", str(SCRIPTS / "plant_nan.py"),
                    cwd=tmp_path)
    assert result.returncode == 1  # the script's own assertion: ptdash changed nothing
    assert "step 6 finite False" in result.stdout
