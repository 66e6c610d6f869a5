"""The prints of a rank whose fds ptdash does not own (engine/outtap.py): each value at the
step it was written at, the stream's own write back at the end, nothing from a forked child."""

from __future__ import annotations

import io
import os
import sys

from ptdash import outtap
from ptdash.printed import PrintedMetrics
from ptdash.stepstate import StepState


def _tapped():
    state, found = StepState(), []
    printed = PrintedMetrics(lambda: state.step, lambda what, message, step=None: found.append((step, message)))
    stream = io.TextIOWrapper(io.BytesIO(), write_through=True)
    return state, printed, stream, outtap.OutputTap(printed, state, streams=[stream]), found


def test_each_value_is_kept_at_the_step_it_was_written_at_whenever_it_is_parsed():
    state, printed, stream, tap, found = _tapped()
    for step in range(1, 5):  # at most printread.FREQUENT lines of a shape a batch: each kept
        state.step = step
        print(f"step {step} | val_loss={step / 10}", file=stream)
    state.step = 40  # parsed long after: still at the steps the lines were written at
    tap.close()
    assert printed.drain() == [(s, {"printed/val_loss": s / 10}) for s in range(1, 5)]
    assert found[0][0] == 1 and found[0][1].startswith("found printed metric val_loss = 0.1 at step 1")
    assert "write" not in vars(stream) and type(stream.write).__name__ == "builtin_function_or_method"  # python's own
    stream.seek(0)
    assert stream.buffer.getvalue().decode().splitlines()[-1] == "step 4 | val_loss=0.4"  # written as ever


def test_an_unfinished_last_line_counts_at_the_end_and_a_parser_behind_takes_no_more(monkeypatch):
    state, printed, stream, tap, _ = _tapped()
    state.step = 3
    stream.write("eval_loss: 0.25")
    monkeypatch.setattr(outtap, "MAX_PENDING", 0)
    stream.write("\nval_acc=0.5\n")  # not queued: the parser was behind
    tap.close()
    assert printed.drain() == [(3, {"printed/eval_loss": 0.25})] and tap.skipped == len("\nval_acc=0.5\n")


def test_a_forked_child_queues_nothing():
    state, printed, stream, tap, _ = _tapped()
    tap._stop.set()  # the parent's thread parses nothing meanwhile
    tap._thread.join()
    pid = os.fork()
    if pid == 0:
        stream.write("val_loss=1\n")
        os._exit(0 if not tap._queue else 1)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    stream.write("val_loss=2\n")
    assert len(tap._queue) == 1
    tap.close()


def test_ptdash_parse_output_0_reads_nothing_and_leaves_the_streams_alone():
    state = StepState()
    printed = PrintedMetrics(lambda: state.step, lambda *a, **k: None)
    assert outtap.OutputTap.start(printed, state, environ={"PTDASH_PARSE_OUTPUT": "0"}) is None
    assert outtap.OutputTap.start(None, state, environ={}) is None  # --no-parse-output in run.json's config
    assert "write" not in vars(sys.stdout) and "write" not in vars(sys.stderr)
    tap = outtap.OutputTap.start(printed, state, environ={"PTDASH_PARSE_OUTPUT": "1"})
    try:
        assert "write" in vars(sys.stdout)
    finally:
        tap.close()
