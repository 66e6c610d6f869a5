"""Profiler windows, the step-time breakdown and the OOM report through the real CLI."""



import json

from ptdash.shared import events, rundir
from ptdash.shared.reader import StoreReader
from support.runner import SCRIPTS, Run, ptdash, wait_for


def test_profile_command_summarises_real_operators_and_writes_a_trace(tmp_path):
    run = Run(tmp_path, SCRIPTS / "steady.py", "--sleep", "0.005")
    try:
        run.wait_step(3)
        ack = run.send("profile", 3)
        assert ack.ok and f"profiling steps {ack.step + 1}-{ack.step + 3}" == ack.message

        def profile_event():
            with run.store() as s:
                return [e for e in s.events() if e.kind == "profile"]
        (event,) = wait_for(profile_event, 60, what="the profile summary")
        report = events.read(event)
        assert isinstance(report, events.Profile) and report.error is None, report
        assert report.steps == (ack.step + 1, ack.step + 3)
        names = {op.name for op in report.top}
        assert names & {"aten::mm", "aten::addmm"}, names
        assert all(op.self_ms >= 0 for op in report.top) and report.top[0].self_ms > 0
        trace = json.loads(open(report.trace).read())
        assert trace["traceEvents"]
        assert run.send("profile", 0.5).ok is False  # whole steps only
        run.wait_step(ack.step + 6)  # training went on
    finally:
        run.close()


def test_a_run_that_ends_inside_a_profile_window_writes_the_steps_it_recorded(tmp_path):
    # The profile of 1000 steps is answered for; the run stops long before: the trace of the
    # steps it saw is written and the run ends cleanly (a profiler left running at the
    # interpreter's exit killed it with SIGSEGV, and nothing was written).
    run = Run(tmp_path, SCRIPTS / "steady.py")
    try:
        run.wait_step(3)
        ack = run.send("profile", 1000)
        assert ack.ok
        run.wait_step(ack.step + 2)
        stop = run.send("stop")
        assert stop.ok
        assert run.wait(90) == 0 and run.info().status == "stopped"
        first, last = ack.step + 1, stop.step
        assert (tmp_path / "run" / "profiles" / f"profile-step{first}-{last}.json").is_file()
        with run.store() as s:
            (event,) = [e for e in s.events() if e.kind == "profile"]
        assert f"profiled steps {first}-{last} (of {first}-{ack.step + 1000}: the run ended at step {last})" \
            in event.message
    finally:
        run.close()


def test_profile_steps_option(tmp_path):
    result = ptdash("--headless", "--run-dir", "run", "--profile-steps", "2:3", str(SCRIPTS / "steady.py"),
                    "--steps", "6", "--sleep", "0", cwd=tmp_path)
    assert result.returncode == 0, result.stdout
    assert list((tmp_path / "run" / "profiles").glob("profile-step2-3.json"))


def test_input_bound_loop_shows_data_waiting_dominant(tmp_path):
    result = ptdash("--headless", "--run-dir", "run", str(SCRIPTS / "slow_data.py"), cwd=tmp_path)
    assert result.returncode == 0, result.stdout
    with StoreReader(tmp_path / "run" / "metrics.db") as s:
        _, data = s.series("time/data_s")
        _, compute = s.series("time/compute_s")
        _, optim = s.series("time/optim_s")
        hints = [e for e in s.events() if e.kind == "hint"]
    assert len(data) >= 30
    median = sorted(data)[len(data) // 2]
    assert median > 0.01  # 8 samples x 2 ms of sleeping
    assert median > 5 * sorted(compute)[len(compute) // 2]
    assert median > 5 * sorted(optim)[len(optim) // 2]
    assert hints and "num_workers" in hints[0].message


def test_out_of_memory_ends_crashed_with_the_report(tmp_path):
    result = ptdash("--headless", "--run-dir", "run", str(SCRIPTS / "oom.py"), cwd=tmp_path)
    assert result.returncode == 1
    info = rundir.read_info(tmp_path / "run")
    assert info.status == "crashed"
    with StoreReader(tmp_path / "run" / "metrics.db") as s:
        (oom,) = [e for e in s.events() if e.kind == "oom"]
    for remedy in ("batch size", "gradient accumulation", "mixed precision", "activation checkpointing"):
        assert remedy in oom.message, remedy
    assert oom.data["error"].startswith("CUDA out of memory")
