"""The script's output stream to printed series (ptdash.printed): redrawn lines, chunks,
steps, names, the first-value events, and the hand-off to the flusher's rows."""

from __future__ import annotations

import pytest

from ptdash import printed as printed_module
from ptdash import printread
from ptdash.printed import PrintedMetrics, merge
from ptdash.shared import events, names


class Stream:
    """A PrintedMetrics fed as the relay feeds it, at a step the test sets."""

    def __init__(self, logged=frozenset()) -> None:
        self.step = 0
        self.events: list[tuple[object, str]] = []
        self.metrics = PrintedMetrics(lambda: self.step,
                                      lambda what, message, step=None: self.events.append((what, message)), logged)

    def feed(self, data: bytes, step: int | None = None) -> None:
        if step is not None:
            self.step = step
        self.metrics.feed(data)

    def found(self) -> dict[int, dict]:
        return dict(self.metrics.drain())


def test_each_chunk_is_kept_at_the_step_it_was_read_at_and_a_line_split_across_chunks_at_its_end():
    s = Stream()
    s.feed(b"corpus 1,000 chars | vocab 65\nstep 10 | loss 2.31 | lr 1e-3\n", step=10)
    s.feed(b"eval step 20 | val lo", step=20)
    s.feed(b"ss 2.2921\n", step=21)
    assert s.found() == {10: {names.printed("loss"): 2.31}, 21: {names.printed("val_loss"): 2.2921}}
    assert s.found() == {}  # drained


def test_a_bar_redrawn_with_carriage_returns_counts_by_its_final_state():
    s = Stream()
    for n in range(1, 9):  # tqdm: "\r" + the bar, each redraw, a newline when it closes
        s.feed(f"\r{n * 100 // 8:3d}%|##| {n}/8 [00:0{n}<00:00, 9.1it/s, loss={1 / n:.3f}, top1=0.{n}]".encode(),
               step=n)
    assert s.found() == {}  # not finished yet: no drawing of a bar is its final state
    s.feed(b"\n", step=8)
    assert s.found() == {8: {names.printed("loss"): 0.125, names.printed("top1"): 0.8}}


def test_a_bar_that_starts_again_on_its_line_counts_the_round_it_ended():
    s = Stream()
    # Lightning: the next epoch redraws the same bar from 0%; the 100% drawing before it was the epoch's end.
    s.feed(b"\rEpoch 0:  50%|#  | 4/8 [00:01<00:01, v_num=0, train_loss=0.5]", step=4)
    s.feed(b"\rEpoch 0: 100%|## | 8/8 [00:02<00:00, v_num=0, train_loss=0.4, val_loss=0.33]", step=8)
    s.feed(b"\rEpoch 1:   0%|   | 0/8 [00:00<?, v_num=0, train_loss=0.4, val_loss=0.33]", step=8)
    s.feed(b"\rEpoch 1: 100%|## | 8/8 [00:02<00:00, v_num=0, train_loss=0.3, val_loss=0.31]\n", step=16)
    assert s.found() == {8: {names.printed("train_loss"): 0.4, names.printed("val_loss"): 0.33},
                         16: {names.printed("train_loss"): 0.3, names.printed("val_loss"): 0.31}}


def test_a_cleared_bar_and_a_line_written_over_it():
    s = Stream()
    # tqdm.write (the Hugging Face Trainer's log line): the bar cleared, the line, the bar again.
    s.feed(b"\r  5%|5  | 10/200 [00:01<00:19,  9.83it/s]\r" + b" " * 40 + b"\r"
           b"{'loss': 0.3412, 'learning_rate': 4.5e-05, 'epoch': 0.15}\n\r  5%|5  | 10/200 [00:01<00:19]", step=10)
    # a bar that clears itself when done (leave=False) leaves its last drawing
    s.feed(b"\r 90%|## | 9/10 [val_acc=0.8]\r100%|## | 10/10 [val_acc=0.9]\r" + b" " * 30 + b"\r", step=12)
    s.feed(b"done\n", step=13)
    assert s.found() == {10: {names.printed("loss"): 0.3412}, 12: {names.printed("val_acc"): 0.9}}


def test_windows_line_ends_terminal_colours_and_keras_backspaces():
    s = Stream()
    s.feed(b"loss: 0.5 - acc: 0.7\r\n\x1b[32mval_loss\x1b[0m=0.25\n8/8 [===]\x08\x08\x08\x08 - loss: 0.1\n", step=3)
    assert s.found() == {3: {names.printed("loss"): 0.1, names.printed("acc"): 0.7,
                             names.printed("val_loss"): 0.25}}


def test_the_same_report_printed_many_times_in_a_chunk_keeps_its_last_value_and_is_read_once(monkeypatch):
    s = Stream()
    calls = []
    real = printread.printparse.parse
    monkeypatch.setattr(printread.printparse, "parse", lambda line: calls.append(line) or real(line))
    chunk = b"".join(b"step %d | loss %.4f | 12 ms/step\n" % (i, 1 / (i + 1)) for i in range(500))
    s.feed(chunk, step=500)
    assert s.found() == {500: {names.printed("loss"): pytest.approx(1 / 500)}}
    assert len(calls) == 1
    # a shape that held no metric is not read again, in this chunk or the next
    s.feed(b"".join(b"sample %d: the quick brown fox\n" % i for i in range(100)), step=501)
    s.feed(b"sample 7: the quick brown fox\n", step=502)
    assert len(calls) == 2 and s.found() == {}


def test_source_lines_after_a_traceback_frame_are_not_metrics():
    s = Stream()
    s.feed(b'Traceback (most recent call last):\n  File "train.py", line 3, in <module>\n'
           b"    loss = 0.5 * criterion(out)\nstep 4 | loss 0.25\n", step=4)
    assert s.found() == {4: {names.printed("loss"): 0.25}}


def test_an_unfinished_line_counts_at_the_end_and_an_overlong_one_never():
    s = Stream()
    s.feed(b"x" * (printread.MAX_TAIL + 10), step=1)
    s.feed(b" loss 0.9\nfinal test acc: 0.97", step=2)
    s.metrics.finish()
    assert s.found() == {2: {names.printed("final_test_acc"): 0.97}}


def test_the_first_value_of_each_name_is_an_event_naming_its_line():
    s = Stream()
    s.feed(b"eval step 200 | val loss 2.2921\n", step=200)
    s.feed(b"eval step 400 | val loss 2.0113\n", step=400)
    (what, message), = s.events
    assert isinstance(what, events.PrintedMetric)
    assert (what.name, what.series, what.value, what.left_out) == ("val_loss", "printed/val_loss", 2.2921, None)
    assert what.line == "eval step 200 | val loss 2.2921"
    assert message == "found printed metric val_loss = 2.2921 at step 200: eval step 200 | val loss 2.2921"


def test_a_name_the_script_gives_ptdash_log_is_left_out_and_said_once():
    logged: set[str] = set()
    s = Stream(logged)
    s.feed(b"val_loss=0.5 acc=0.9\n", step=1)
    logged.add("val_loss")  # the script calls ptdash.log(val_loss=...) from now on
    s.feed(b"val_loss=0.4 acc=0.91\nval_loss=0.3\n", step=2)
    assert s.found() == {1: {names.printed("val_loss"): 0.5, names.printed("acc"): 0.9},
                         2: {names.printed("acc"): 0.91}}
    left = [what for what, _ in s.events if what.left_out]
    assert [(w.name, w.left_out) for w in left] == [("val_loss", "logged")]


def test_at_most_max_names_names(monkeypatch):
    monkeypatch.setattr(printed_module, "MAX_NAMES", 3)
    s = Stream()
    s.feed(b"a_loss=1 b_loss=2 c_loss=3 d_loss=4\ne_loss=5 a_loss=6\n", step=1)
    assert set(s.found()[1]) == {names.printed(n) for n in ("a_loss", "b_loss", "c_loss")}
    assert [w.left_out for w, _ in s.events] == [None, None, None, "too many"]


def test_a_line_that_breaks_the_parser_is_logged_and_the_rest_goes_on(monkeypatch, caplog):
    s = Stream()
    monkeypatch.setattr(printread.printparse, "parse", lambda line: 1 / 0)
    s.feed(b"loss 0.5\n", step=1)
    assert "failed" in caplog.text and s.found() == {}


def test_merge_puts_each_value_in_its_steps_row_or_a_row_with_that_steps_wall_time():
    rows = [[11, 110.0, {"loss": 1.0}], [12, 120.0, {"loss": 0.9}]]
    earlier = [[9, 90.0, {"loss": 1.2}], [10, 100.0, {"loss": 1.1}]]
    merged = merge(rows, [(0, {"printed/a": 1.0}), (10, {"printed/b": 2.0}), (12, {"printed/c": 3.0})], earlier)
    assert [r[0] for r in merged] == [0, 10, 11, 12]
    assert merged[1] == [10, 100.0, {"printed/b": 2.0}]  # the step's own wall time, from the flush before
    assert merged[3] == [12, 120.0, {"loss": 0.9, "printed/c": 3.0}]
    assert merged[0][1] > 1e9  # step 0 (before the first step) has no row anywhere: the time now
    assert merge(rows, [], earlier) is rows


def test_a_chunk_of_many_lines_with_bars_among_them_reads_each_line_and_each_bars_final_state():
    s = Stream()
    plain = b"".join(b"layer %d weight mean 0.%d\n" % (i, i) for i in range(50))
    bar = b"\r 50%|#  | 1/2 [00:01<00:01, 9.1it/s, top1=0.5]\r100%|## | 2/2 [00:02<00:00, 9.1it/s, top1=0.75]\n"
    s.feed(plain + b"step 3 | train loss 0.5\n" + bar + plain + b"eval | val acc 0.9\n" + bar.replace(b"0.75", b"0.8"),
           step=3)
    assert s.found() == {3: {names.printed("train_loss"): 0.5, names.printed("top1"): 0.8,
                             names.printed("val_acc"): 0.9}}  # one chunk, one step: the last of each
    s.feed(b"\r 50%|#  | 1/2 [00:01<00:01, top1=0.1]" + plain + b"\r100%|## | 2/2 [00:02<00:00, top1=0.2]\n", step=4)
    assert s.found() == {4: {names.printed("top1"): 0.2}}


def test_a_batch_keeps_each_reports_line_at_its_step_unless_it_comes_at_every_step():
    s = Stream()
    pieces = [(15, b"eval step 15 | val loss 3.16\n"), (16, b"sample | abc\n"), (20, b"step 20 | loss 3.15\n"),
              (30, b"step 30 | loss 3.12\n"), (30, b"eval step 30 | val loss 3.15\n")]
    pieces += [(40 + i, b"\r%3d%%|# | %d/9 [00:01<00:01, top1=0.%d]" % (i * 10, i, i)) for i in range(1, 10)]
    pieces += [(50, b"\n")]
    s.metrics.feed_pieces(pieces)
    # The evals and the loss lines at their own steps; the bar, drawn at nine steps: its final state.
    assert s.found() == {15: {names.printed("val_loss"): 3.16}, 20: {names.printed("loss"): 3.15},
                         30: {names.printed("loss"): 3.12, names.printed("val_loss"): 3.15},
                         50: {names.printed("top1"): 0.9}}
    flood = [(s_, b"step %d | loss 0.%d\n" % (s_, s_)) for s_ in range(100, 110)]
    s.metrics.feed_pieces(flood)
    assert s.found() == {109: {names.printed("loss"): 0.109}}  # at every step: the newest of the batch
