"""Printed metrics on their way to the store: the flusher writes them with the rows of their
steps, and a row that holds only what the script printed is no step made (a stall is still named)."""

from __future__ import annotations

import time

from ptdash.flusher import Flusher
from ptdash.printed import PrintedMetrics
from ptdash.ranks import RankCollector
from ptdash.shared import names


class Parts:
    """What a flush touches, recorded: the recorder's rows, the journal's events, the store's writes."""

    def __init__(self) -> None:
        self.rows: list = []
        self.events: list = []
        self.writes: list = []
        self.published: list = []
        self.pending = 0
        self.dropped = None  # the recorder's: no record was unreadable

    # recorder
    def drain(self):
        rows, self.rows = self.rows, []
        return rows, []

    # doctor, anomalies
    def on_flush(self, *args):
        pass

    def check_rows(self, rows):
        pass

    # store
    def write(self, rows=(), events=(), **kwargs):
        self.writes.append([list(r) for r in rows])
        self.events.append(list(events))

    def take_notes(self):
        return []


class Journal:
    def __init__(self) -> None:
        self.pending: list = []

    def event(self, what, message, step=None):
        self.pending.append(message)

    def drain(self):
        pending, self.pending = self.pending, []
        return pending


def test_a_flush_writes_each_printed_value_in_its_steps_row_and_its_event_with_it():
    parts, journal = Parts(), Journal()
    step = [0]
    printed = PrintedMetrics(lambda: step[0], journal.event, set())
    flusher = Flusher(parts, journal, parts, parts, None, None, parts.published.append, store=parts,
                      printed=printed)
    parts.rows = [[1, 10.0, {"loss": 2.0}], [2, 20.0, {"loss": 1.9}]]
    step[0] = 2
    printed.feed(b"eval step 2 | val loss 2.2921\n")
    flusher.flush()
    assert parts.writes[-1] == [[1, 10.0, {"loss": 2.0}], [2, 20.0, {"loss": 1.9, names.printed("val_loss"): 2.2921}]]
    assert parts.events[-1] == ["found printed metric val_loss = 2.2921 at step 2: eval step 2 | val loss 2.2921"]
    # The row of step 2 went with the flush before: a row of its own, at that step's time.
    parts.rows = [[3, 30.0, {"loss": 1.8}]]
    printed.feed(b"eval step 2 | val acc 0.5\n")
    flusher.flush()
    assert parts.writes[-1] == [[2, 20.0, {names.printed("val_acc"): 0.5}], [3, 30.0, {"loss": 1.8}]]
    assert [e.split(" =")[0] for e in parts.events[-1]] == ["found printed metric val_acc"]
    printed.feed(b"eval step 2 | val acc 0.5\n")
    parts.rows = [[4, 40.0, {"loss": 1.7}]]
    before = time.time()
    flusher.flush()  # the same value printed again: a value, no second event
    # Step 2's row went two flushes ago: the time now (the store keeps the step's first, test_store.py).
    (step2, wall, values), row4 = parts.writes[-1]
    assert (step2, values, row4) == (2, {names.printed("val_acc"): 0.5}, [4, 40.0, {"loss": 1.7}]) and wall >= before
    assert parts.events[-1] == []


def test_a_row_of_a_step_seen_already_is_not_a_step_made():
    stalls: list = []
    collector = RankCollector(None, lambda msg: None, lambda what, message: stalls.append(message),
                              lambda: "running", stall_seconds=0.05)
    collector.collect([[5, 1.0, {"loss": 1.0}]])
    time.sleep(0.2)
    # Only what the script printed since, at the same step: the rank still makes no step.
    collector.collect([[5, 1.0, {names.printed("val_loss"): 2.0}]])
    assert stalls and "no rank made a step" in stalls[0]
    collector.collect([[6, 2.0, {"loss": 0.9}]])
    assert stalls[-1].endswith(": every rank makes steps again")


def test_a_printed_training_loss_that_is_ptdashs_own_is_not_kept_twice_and_one_that_differs_is():
    parts, journal = Parts(), Journal()
    step = [0]
    printed = PrintedMetrics(lambda: step[0], journal.event, set())
    flusher = Flusher(parts, journal, parts, parts, None, None, parts.published.append, store=parts,
                      printed=printed)
    # The demo's lines: its loss to 4 digits, a running mean of its own, a validation loss.
    parts.rows = [[s, float(s), {"loss": 2.0 + s / 1e5}] for s in range(1, 11)]
    step[0] = 10
    printed.feed(b"step 10 | loss 2.0001 | avg_loss 2.5 | lr 1.0e-03\neval step 10 | val loss 2.3\n")
    flusher.flush()
    assert parts.writes[-1][-1] == [10, 10.0, {"loss": 2.0001, names.printed("avg_loss"): 2.5,
                                               names.printed("val_loss"): 2.3}]
    assert "printed metric loss is the loss ptdash records (loss: 2.0001 at step 10): not kept twice" \
        in parts.events[-1]
    # A judged name stays judged; the last line's summary is judged by its own step's loss.
    parts.rows = [[11, 11.0, {"loss": 1.5}]]
    step[0] = 11
    printed.feed(b"step 11 | loss 1.5 | avg_loss 1.6\n")
    flusher.flush()
    assert parts.writes[-1] == [[11, 11.0, {"loss": 1.5, names.printed("avg_loss"): 1.6}]]
    step[0] = 12
    parts.rows = [[12, 12.0, {"loss": 0.2513}]]
    flusher.flush()
    printed.feed(b"done | final train loss 0.2513\n")  # read after its step's row went: the rows before judge
    flusher.flush()
    assert [r for w in parts.writes[-2:] for r in w] == [[12, 12.0, {"loss": 0.2513}]]
    assert parts.events[-1] == ["found printed metric final_train_loss = 0.2513 at step 12: done | final train loss "
                                "0.2513", "printed metric final_train_loss is the loss ptdash records (loss: 0.2513 at "
                                "step 12): not kept twice"]


def test_a_printed_loss_with_too_few_digits_to_tell_is_kept_until_one_tells():
    parts, journal = Parts(), Journal()
    step = [1]
    printed = PrintedMetrics(lambda: step[0], journal.event, set())
    flusher = Flusher(parts, journal, parts, parts, None, None, parts.published.append, store=parts,
                      printed=printed)
    # 1/step printed to 4 places: "1.0000" reads as 1.0, within 0.05 of step 1's loss 1.02.
    for s, loss, line in ((1, 1.02, b"step 1 | loss 1.0000\n"), (2, 1.01, b"step 2 | loss 0.5000\n"),
                          (3, 0.99, b"step 3 | loss 0.3333\n"), (4, 0.25, b"step 4 | loss 0.2500\n")):
        parts.rows, step[0] = [[s, float(s), {"loss": loss}]], s
        printed.feed(line)
        flusher.flush()
    assert [w[0][2].get(names.printed("loss")) for w in parts.writes] == [1.0, 0.5, 0.3333, 0.25]
    assert not any("not kept twice" in e for events in parts.events for e in events)
