"""Typed event data (ptdash.shared.events): every kind round-trips, reading never raises, and
the dashboard never reads event data by key."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from ptdash.shared import events
from ptdash.shared.protocol import Event

ROOT = Path(__file__).resolve().parents[2]

SAMPLES = [
    events.CommandAnswer(id="c1", name="clip", value=0.5, ok=True, applied_step=12),
    events.Anomaly(step=3, action="pause", layer="fc.weight"),
    events.Anomaly(step=9, loss=12.5, average=1.25),
    events.Anomaly(flag="exploding", layer="fc.bias", count=2),
    events.Stall(step=29, ranks=(1, 3), seconds=41.5, why="the others wait for it at step 30"),
    events.Stall(step=30, ended=True),
    events.Checkpoint(path="/r/checkpoints/step-10.pt", bytes=1024, seconds=0.25, reason="stop"),
    events.Checkpoint(removed=("/r/a.pt", "/r/b.pt")),
    events.Finding(id="input-bound", what="w", why="y", fix="f", severity="warning", step=4, source="t.py:3",
                   extra={"num_workers": 0, "pin_memory": False}),
    events.Hint(data_share=0.7),
    events.Warned(origin="python", category="UserWarning", text="t", source="t.py:9"),
    events.Warned(missing=(2, 3)),
    events.Sampling(every=16, doctor_every=64, budget_pct=3.0),
    events.Profile(steps=(4, 6), trace="/r/p.json", device="cpu",
                   top=(events.TopOp(name="aten::mm", calls=3, self_ms=1.5, cpu_mem_bytes=-16),)),
    events.Profile(steps=(4, 6), error="another profiler is active"),
    events.Oom(cuda=True, device="cuda:0", error="CUDA out of memory", allocator=({"reserved": 1},),
               remedies=("smaller batch",), snapshot="/r/s.pickle"),
    events.Optimizer(index=1, cls="Adam", models="Generator"),
    events.Optimizer(index=0, cls="LBFGS", main_from=51),
    events.RunNote(models=("Net",), world=2, restored=("model",), warnings=("w",)),
    events.PrintedMetric(name="val_loss", series="printed/val_loss", value=2.29, line="eval | val loss 2.29"),
    events.PrintedMetric(name="acc", left_out="logged"),
]


def _event(data: events.EventData) -> Event:
    kind, body = events.encode(data)
    return Event(kind=kind, step=1, wall=0.0, message="m", data=body)


@pytest.mark.parametrize("data", SAMPLES, ids=lambda d: type(d).__name__)
def test_every_kind_round_trips_through_its_json(data):
    import json

    event = _event(data)
    event = dataclasses.replace(event, data=json.loads(json.dumps(event.data)))  # as the store gives it back
    assert events.read(event) == data


def test_every_kind_is_registered_and_has_defaults():
    assert set(events.KINDS) >= {type(d).kind for d in SAMPLES}
    for cls in events.KINDS.values():
        assert cls.kind and cls() == cls.from_data({})  # every field has a default


@pytest.mark.parametrize("kind, data, expected", [
    ("stall", {"ranks": "1", "step": "x", "seconds": 3}, events.Stall(seconds=3.0)),
    ("stall", {"ranks": [1, "2"], "step": True}, events.Stall()),
    ("command", {"ok": 1, "value": "0.5", "name": 7}, events.CommandAnswer()),
    ("profile", {"top": [{"name": "mm", "calls": "3"}, 5]}, events.Profile()),
    ("profile", {"top": [{"name": "mm", "calls": "3"}]}, events.Profile(top=(events.TopOp(name="mm"),))),
    ("checkpoint", [], events.Checkpoint()),
])
def test_reading_damaged_data_gives_defaults_never_raises(kind, data, expected):
    assert events.read(Event(kind=kind, step=1, wall=0.0, message="m", data=data)) == expected


def test_a_kind_this_version_does_not_know_reads_as_a_note():
    assert events.read(Event(kind="from-the-future", step=1, wall=0.0, message="m", data={"x": 1})) == events.Note()
    assert events.read(Event(kind="disk", step=1, wall=0.0, message="the disk is full")) == events.Note()


def test_older_engines_shapes_are_read_as_todays_kinds():
    stall = Event(kind="anomaly", step=30, wall=0.0, message="m", data={"stalled_ranks": [1], "step": 29})
    assert events.read(stall) == events.Stall(step=29, ranks=(1,))
    named = Event(kind="run", step=3, wall=0.0, message="m",
                  data={"optimizer": 1, "name": "Generator", "class": "Adam"})
    assert events.read(named) == events.Optimizer(index=1, cls="Adam", models="Generator")
    plain = Event(kind="run", step=3, wall=0.0, message="m", data={"models": ["Net"]})
    assert events.read(plain) == events.RunNote(models=("Net",))


def test_a_findings_details_stay_flat_in_its_json():
    kind, data = events.encode(events.Finding(id="r", what="w", extra={"num_workers": 0, "id": "shadowed"}))
    assert kind == "finding" and data["num_workers"] == 0 and data["id"] == "r"


def _data_reads(path: Path) -> list[tuple[int, str]]:
    """``x.data[...]`` and ``x.data.get(...)``: an event's data read by key."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        target = node.value if isinstance(node, ast.Subscript) else (
            node.func.value if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get" else None)
        if isinstance(target, ast.Attribute) and target.attr == "data":
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_the_terminal_side_reads_event_data_by_attribute_never_by_key():
    reads = [f"{p.relative_to(ROOT)}:{line}: {text}" for p in sorted((ROOT / "tui").rglob("*.py"))
             for line, text in _data_reads(p)]
    assert not reads, "\n".join(reads)


def test_the_walk_catches_a_key_read(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("a = event.data['layer']\nb = ev.data.get('action')\nc = events.read(ev).layer\n")
    assert [line for line, _ in _data_reads(path)] == [1, 2]
