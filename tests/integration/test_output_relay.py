"""The output relay's copier, a process of its own (engine/outproc.py), in real processes.

Each test runs a Python process that relays its fds 1 and 2 as a rank's engine does
(``OutputRelay.for_rank``: the pipe, the copier, the step marks, the metrics read), prints
at its steps and closes the relay; then what reached output.log, what was found at which
step and what the copier did are read back. Every wait is on something observable.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

from ptdash.tui.hardstop import alive
from support.runner import ENV, wait_for

RELAYED = textwrap.dedent("""\
    import json, os, pathlib, signal, sys, time
    from ptdash.enginelog import setup_logging
    from ptdash.output import OutputRelay
    from ptdash.printed import PrintedMetrics
    from ptdash.stepstate import StepState

    run, what = sys.argv[1], sys.argv[2]
    say = os.fdopen(os.dup(1), "w")  # past the relay: this test's report
    setup_logging(pathlib.Path(run))  # as a rank's engine: its warnings to engine.log
    state = StepState()
    printed = PrintedMetrics(lambda: state.step, lambda *a, **k: None)
    relay = OutputRelay.for_rank(run)
    relay.follow(printed, state)
    copier = relay.copier.pid

    def until(ok):
        deadline = time.monotonic() + 60
        while not ok():
            assert time.monotonic() < deadline, "timed out"
            time.sleep(0.01)

    def steps(first, last):
        for step in range(first, last + 1):
            state.step = step
            print(f"step {step} | 12.5 ms/step | " + "filler " * 20, flush=True)
            if step % 10 == 0:  # an evaluation every 10 steps
                print(f"eval at step {step} | val_loss {1 / step:.4f}", flush=True)
            if state.out_dirty:
                state.out_mark(step + 1)  # the step's boundary, as stepend.py has it

    def copied(text):
        try:
            return open(os.path.join(run, "output.log")).read().endswith(text)
        except OSError:
            return False

    steps(1, 20)
    step_20 = "eval at step 20 | val_loss 0.0500\\n"
    if what == "kill":
        until(lambda: copied(step_20))  # then nothing is held in the copier
        os.kill(copier, signal.SIGKILL)
    elif what == "signals":
        until(lambda: copied(step_20))
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            os.kill(copier, sig)
    elif what == "worker":
        worker = os.fork()
        if worker == 0:  # a persistent DataLoader worker: it outlives the relay's close
            until(lambda: os.path.exists(os.path.join(run, "closed")))
            os.write(1, b"the worker's last line\\n")
            os._exit(0)
    steps(21, 40)
    relay.close()
    open(os.path.join(run, "closed"), "w").close()
    found = {step: values for step, values in printed.drain()}
    let_go = relay.copier is None  # it outlived the close (the worker holds the pipe)
    if what == "worker":
        os.waitpid(worker, 0)
    relay._thread.join(60)  # the relay's thread ends with the copier's frames
    say.write(json.dumps({"copier": copier, "found": found, "let_go": let_go, "reached_end": relay.reached_end}))
    say.flush()
""")


def _relay(tmp_path, what: str = "plain") -> dict:
    run = tmp_path / "run"
    run.mkdir()
    proc = subprocess.run([sys.executable, "-c", RELAYED, str(run), what], capture_output=True, text=True,
                          env=ENV, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    said = json.loads(proc.stdout)
    said["log"] = (run / "output.log").read_text()
    said["engine_log"] = (run / "engine.log").read_text() if (run / "engine.log").exists() else ""
    return said


def _lines(first: int, last: int) -> str:
    return "".join(f"step {s} | 12.5 ms/step | " + "filler " * 20 + "\n"
                   + (f"eval at step {s} | val_loss {1 / s:.4f}\n" if s % 10 == 0 else "")
                   for s in range(first, last + 1))


def _every_value_at_its_step(found: dict, first: int, last: int) -> None:
    assert {int(s): v for s, v in found.items()} == \
        {s: {"printed/val_loss": float(f"{1 / s:.4f}")} for s in range(first, last + 1) if s % 10 == 0}


def test_the_copier_copies_and_reads_the_output_in_a_process_of_its_own(tmp_path):
    said = _relay(tmp_path)
    assert said["copier"] != os.getpid()
    assert said["log"] == _lines(1, 40)  # every byte, no mark, in order
    _every_value_at_its_step(said["found"], 1, 40)
    assert said["reached_end"]  # the pipe's end: it ends by itself


def test_a_killed_copier_is_followed_by_a_thread_and_the_output_goes_on(tmp_path):
    said = _relay(tmp_path, "kill")
    # What the copier had copied, then everything printed after its death.
    assert said["log"] == _lines(1, 40)
    _every_value_at_its_step(said["found"], 1, 40)
    assert "the output relay's process ended (exit code -9); a thread of this one copies the output" \
        in said["engine_log"]


def test_the_signals_that_stop_a_job_leave_the_copier_copying(tmp_path):
    said = _relay(tmp_path, "signals")  # SIGINT, SIGTERM and SIGHUP, as a Ctrl-C or a scheduler sends
    assert said["log"] == _lines(1, 40)
    _every_value_at_its_step(said["found"], 1, 40)
    assert said["reached_end"]  # not ended by a signal


def test_a_worker_that_outlives_the_close_has_its_output_copied(tmp_path):
    said = _relay(tmp_path, "worker")
    assert said["let_go"] and said["reached_end"]  # still copying at the close, and to the end
    assert not alive(said["copier"])
    log = (tmp_path / "run" / "output.log").read_text()
    assert log == _lines(1, 40) + "the worker's last line\n"
    _every_value_at_its_step(said["found"], 1, 40)


def test_a_hard_stop_kills_the_run_and_leaves_the_copier_to_end_by_itself(tmp_path):
    """A run killed from the front (tui/hardstop.py) while its script holds the GIL: the copier,
    not stuck with it, has its last line in output.log; the kill leaves it to reach the pipe's
    end and exit, with nothing left for the front to drain."""
    from ptdash.tui.hardstop import kill_tree

    run = tmp_path / "run"
    run.mkdir()
    hangs = textwrap.dedent("""\
        import os, sys
        from ptdash.output import OutputRelay
        relay = OutputRelay.for_rank(sys.argv[1])
        open(os.path.join(sys.argv[1], "copier"), "w").write(str(relay.copier.pid))
        print("the last line before the hang", flush=True)
        sum(range(10 ** 15))  # one C call: the GIL is never let go
    """)
    proc = subprocess.Popen([sys.executable, "-c", hangs, str(run)], env=ENV)
    try:
        wait_for(lambda: b"the last line" in (run / "output.log").read_bytes() if (run / "output.log").exists()
                 else False, 60, what="the line copied")
        copier = int((run / "copier").read_text())
        assert kill_tree(proc.pid, run / "output.log") == 0  # nothing left for the front to drain
        assert proc.wait(30) == -signal.SIGKILL
        wait_for(lambda: not alive(copier), 30, what="the copier to end")
        assert (run / "output.log").read_text() == "the last line before the hang\n"
    finally:
        if proc.poll() is None:
            proc.kill()
