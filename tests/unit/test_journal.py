"""The journal: events published at once and drained for the store, answers journaled,
the command journal kept in memory, state changes written to run.json."""

from __future__ import annotations

import math

import pytest

from ptdash.controls import Settings
from ptdash.journal import Journal
from ptdash.shared import events, rundir
from ptdash.shared.protocol import Ack, Command, Event, Status


def _journal(tmp_path=None, rank=0):
    sent, woken = [], []
    run_dir = rundir.create(tmp_path, "j") if tmp_path is not None else None
    journal = Journal(sent.append, lambda: 7, Settings(clip=0.5), rank=rank, run_dir=run_dir,
                      wake=lambda: woken.append(1))
    return journal, sent, woken, run_dir


def test_events_are_published_at_once_and_drained_once_for_the_store():
    journal, sent, _, _ = _journal()
    event = journal.event(events.Checkpoint(path="x.pt", seconds=math.nan), "saved")
    assert sent == [event] and event.step == 7 and event.kind == "checkpoint"
    assert event.data == {"path": "x.pt", "bytes": None, "seconds": None, "reason": None, "removed": [],
                          "nonfinite": True}
    assert events.read(event) == events.Checkpoint(path="x.pt")
    assert journal.drain() == [event] and journal.drain() == []


def test_answers_are_journaled_and_the_command_journal_needs_no_flush():
    journal, sent, _, _ = _journal()
    journal.ack(Command(id="c1", name="clip", value=0.25), True, 7, "clip norm 0.5 -> 0.25 from step 8")
    journal.ack(Command(id="c2", name="lr_scale", value=-1.0), False, None, "LR factor must be > 0")
    assert [type(m) for m in sent] == [Ack, Event, Ack, Event]
    commands = journal.commands()
    assert [c["data"]["id"] for c in commands] == ["c1", "c2"]
    assert commands[0]["data"]["applied_step"] == 7 and commands[1]["data"]["ok"] is False
    journal.drain()
    assert len(journal.commands()) == 2  # kept after the store took them


def test_other_ranks_do_not_answer():
    journal, sent, _, _ = _journal(rank=1)
    journal.ack(Command(id="c1", name="pause"), True, 3, "paused")
    assert sent == [] and journal.commands() == []
    assert journal.event("warning", "w").rank == 1


def test_state_changes_publish_wake_the_flusher_and_write_run_json(tmp_path):
    journal, sent, woken, run_dir = _journal(tmp_path)
    journal.total_steps = 100
    journal.set_state("paused", paused_at=7)
    (status,) = sent
    assert isinstance(status, Status) and status.state == "paused" and status.paused_at == 7 and status.clip == 0.5
    assert woken == [1]
    info = rundir.read_info(run_dir)
    assert (info.status, info.paused_at, info.total_steps, info.clip, info.step) == ("paused", 7, 100, 0.5, 7)
    journal.set_state(None)  # a setting changed: published, no wake
    assert len(sent) == 2 and woken == [1]


def test_a_finished_run_totals_its_own_last_step_not_the_guess(tmp_path):
    # A schedule's end (a rollback's restored scheduler says 201, a --steps given 100) is a guess;
    # the script that ended by itself ended at its total. A stopped run keeps the guess.
    journal, sent, _, run_dir = _journal(tmp_path)
    journal.total_steps = 201
    journal.set_state("finished")
    assert sent[-1].total_steps == 7 and rundir.read_info(run_dir).total_steps == 7
    journal, sent, _, run_dir = _journal(tmp_path / "b")
    journal.total_steps = 201
    journal.set_state("stopped")
    assert sent[-1].total_steps == 201 and rundir.read_info(run_dir).total_steps == 201


def test_every_answer_is_journaled_a_flood_of_refusals_too():
    journal, sent, _, _ = _journal()
    for n in range(100):
        journal.ack(Command(id=f"c{n}", name="\udcffbad"), False, None, "unknown command")
    journal.ack(Command(id="late", name="clip", value=1e308), False, None, "clip norm must be from 1e-6 to 1e6")
    acks = [m for m in sent if isinstance(m, Ack)]
    assert [a.id for a in acks] == [f"c{n}" for n in range(100)] + ["late"]
    journaled = journal.drain()
    assert [events.read(e).id for e in journaled] == [a.id for a in acks]
    assert journaled[0].message == "'\\udcffbad' refused: unknown command"  # printable, as quoted
    assert journaled[-1].message == "clip refused: clip norm must be from 1e-6 to 1e6"
    assert events.read(journaled[-1]) == events.CommandAnswer(id="late", name="clip", value=1e308, ok=False)


@pytest.mark.parametrize("old, new, said", [
    (None, 0.5, "clip norm 0.5 from step 121 (was the script's own clipping)"),
    (0.5, 0.25, "clip norm 0.5 -> 0.25 from step 121"),
    (0.5, None, "clip norm 0.5 -> the script's own clipping from step 121"),
    (None, None, "clip norm unchanged: the script's own clipping"),
])
def test_a_clip_change_says_what_it_replaced(old, new, said):
    # "off" was the word for no live clip, and read "clip norm off -> 0.5" beside a chart
    # showing the script's own "clip 1".
    from ptdash.controls import _clip_change

    assert _clip_change(old, new, 121) == said
