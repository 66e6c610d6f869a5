"""The recorder's drain: records in, Metrics rows out, in order, whichever path a record takes
(a lean step's host numbers become a row at once; the others wait for their device copy)."""

import math

import torch

from ptdash.recorder import Recorder, StepRecord

TIMES = (10.0, None, None, 10.5, None, 0.0)


def lean(step: int, loss: float = 0.25, lr: float = 0.01) -> StepRecord:
    """A lean step's record, as stepend.py makes it: the loss read already, one float LR."""
    return StepRecord(step, 1000.0 + step, [loss], None, None, None, None, [lr], TIMES, 0, None, None, 0, 1e-5, 0.0)


def drained(*records) -> list:
    recorder = Recorder()
    for r in records:
        recorder.add(r)
    rows, _ = recorder.drain()
    return rows


def test_a_lean_record_gives_the_row_the_general_path_gives():
    fast = drained(lean(1))
    general = drained(lean(1)._replace(losses=[torch.tensor(0.25)]))
    assert fast == general == [[1, 1001.0, {"loss": 0.25, "opt/lr/group0": 0.01, "time/step_s": 0.5}]]
    assert list(fast[0][2]) == list(general[0][2])  # the same series, in the same order


def test_non_finite_numbers_of_a_lean_record_are_none():
    (row,) = drained(lean(3, loss=math.nan, lr=math.inf))
    assert row[2]["loss"] is None and row[2]["opt/lr/group0"] is None


def test_rows_keep_the_records_order_across_both_paths():
    sampled = lean(2)._replace(losses=[torch.tensor(0.5)], total=torch.tensor(2.0), clip_max=1.0)
    rows = drained(lean(1), sampled, lean(3))
    assert [r[0] for r in rows] == [1, 2, 3]
    assert rows[1][2]["grad/norm_total"] == 2.0 and rows[1][2]["grad/clipped"] == 1.0
    assert "grad/norm_total" not in rows[0][2] and "grad/norm_total" not in rows[2][2]


def test_another_optimizers_step_joins_the_lean_row_of_its_iteration():
    # A GAN: the main optimizer's lean step, then the generator's at the same step.
    other = StepRecord(1, 1001.5, [0.75], None, None, None, None, [0.002], None, 0, None, None, 1)
    rows = drained(lean(1), other, lean(2))
    assert len(rows) == 2
    assert rows[0][2] == {"loss": 0.25, "opt/lr/group0": 0.01, "time/step_s": 0.5,
                          "opt1/loss": 0.75, "opt1/lr/group0": 0.002}


def test_a_record_the_flush_cannot_read_is_dropped_alone(caplog):
    # One field too many (built without stepend.py's check), and an LR no row can take.
    wrong_shape = tuple.__new__(StepRecord, (*lean(2), 0.0))
    no_number = lean(3)._replace(lrs=[object()])
    observed = []
    recorder = Recorder(observed.extend)
    for r in (lean(1), wrong_shape, no_number, lean(4)):
        recorder.add(r)
    rows, _ = recorder.drain()
    assert rows == [[1, 1001.0, {"loss": 0.25, "opt/lr/group0": 0.01, "time/step_s": 0.5}],
                    [4, 1004.0, {"loss": 0.25, "opt/lr/group0": 0.01, "time/step_s": 0.5}]]
    assert observed == [lean(1), lean(4)]  # the budget sees the records that were kept
    assert "dropped 2 of 4 step records the flush could not read (ValueError: too many values to unpack" in caplog.text
    assert len(recorder) == 0
