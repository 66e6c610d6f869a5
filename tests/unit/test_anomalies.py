"""Anomalies: the one non-finite path (before the update on CPU, at the flush elsewhere),
loss spikes and per-layer gradient flags, judged on host values."""

from __future__ import annotations

import pytest
import torch

from ptdash.anomalies import Anomalies, Thresholds
from ptdash.shared.events import Anomaly, Warned, encode
from support.journaled import journaled


class _Run:
    """What the anomaly checks are handed: a journal, the pause controls, parameter names."""

    def __init__(self, action: str = "pause", paused: bool = False) -> None:
        self.events: list[tuple[str, str, dict]] = []
        self.pauses: list[tuple[int, str]] = []
        self.requests: list = []
        self.paused = paused
        self.action = action

    def anomalies(self, thresholds: Thresholds = Thresholds()) -> Anomalies:
        return Anomalies(journaled(lambda *event: self.events.append(event)), self.action,
                         lambda step, reason: self.pauses.append((step, reason)), self.requests.append,
                         lambda: self.paused or bool(self.requests), lambda params: [f"p{i}" for i in range(len(params))],
                         thresholds)


def test_loss_spike_is_reported_once_after_warmup():
    run = _Run()
    m = run.anomalies(Thresholds(warmup_steps=5))
    rows = [[s, 0.0, {"loss": 1.0}] for s in range(1, 30)]
    assert m.check_rows(rows) == []
    events = m.check_rows([[30, 0.0, {"loss": 10.0}], [31, 0.0, {"loss": 12.0}]])
    assert len(events) == 1 and events[0][0] == Anomaly(step=30, loss=10.0, average=1.0)
    assert "loss spike at step 30" in events[0][1]
    assert run.events == [(kind, message, data) for kind, data, message in
                          ((*encode(what), message) for what, message in events)]  # journaled, not only returned


@pytest.mark.parametrize("action", ["warn", "skip"])
def test_a_non_finite_step_seen_at_the_flush_is_reported_once(action):
    run = _Run(action)
    m = run.anomalies()
    m.check_rows([[1, 0.0, {"loss": None}], [2, 0.0, {"grad/norm_total": None}]])
    m.check_rows([[3, 0.0, {"loss": None}]])
    assert [e[1] for e in run.events] == ["non-finite loss or gradient at step 1"] and run.requests == []


def test_a_non_finite_step_seen_at_the_flush_pauses_at_the_next_step_under_pause():
    run = _Run("pause")
    m = run.anomalies()
    m.check_rows([[7, 0.0, {"loss": 1.0, "grad/norm_total": None}], [8, 0.0, {"loss": None}]])
    (command,) = run.requests  # one pause, though two steps were bad
    assert command.name == "pause" and command.id == "anomaly-7"
    assert "seen at the flush; pausing at the next step" in run.events[0][1] and run.events[0][2]["action"] == "pause"


def test_a_step_handled_before_its_update_is_not_reported_again_at_the_flush():
    run = _Run("skip")
    m = run.anomalies()
    model = torch.nn.Linear(2, 1)
    model(torch.randn(3, 2)).sum().backward()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    m.before_update(opt, 5, torch.tensor([1.0, float("nan")]), list(model.parameters()))
    assert all(p.grad is None for p in model.parameters())  # the update is dropped
    (kind, message, data), = run.events
    assert message == "non-finite gradient before the update of step 5, first in p1; update skipped"
    m.check_rows([[5, 0.0, {"loss": None}]])
    assert len(run.events) == 1


def test_pause_before_the_update_blocks_then_drops_it():
    run = _Run("pause")
    m = run.anomalies()
    model = torch.nn.Linear(2, 1)
    model(torch.randn(3, 2)).sum().backward()
    m.before_update(torch.optim.SGD(model.parameters(), lr=1.0), 3, None, list(model.parameters()))
    assert run.pauses == [(2, "the loss")] and all(p.grad is None for p in model.parameters())
    assert [e[1] for e in run.events][-1] == "skipped the non-finite update of step 3"


def test_layer_flags_name_the_first_affected_layer():
    m = _Run().anomalies(Thresholds(warmup_steps=3))
    names = ["a.weight", "a.bias", "b.weight"]
    for step in range(5):
        flags, events = m.check_layers(step, names, [1.0, 1.0, 1.0])
        assert flags == {} and events == []
    flags, events = m.check_layers(6, names, [1.0, None, 1e-9])
    assert flags == {"1": "nonfinite", "2": "vanishing"}
    assert [e[1] for e in events] == ["nonfinite gradient at step 6: a.bias", "vanishing gradient at step 6: b.weight"]
    assert [e[0] for e in events] == [Anomaly(flag="nonfinite", layer="a.bias", count=1),
                                      Warned(flag="vanishing", layer="b.weight", count=1)]
    flags, events = m.check_layers(7, names, [100.0, 1.0, 1.0])  # a jump of 100x its average
    assert flags == {"0": "exploding"} and "exploding gradient at step 7: a.weight" in events[0][1]
    assert m.check_layers(8, names, [1.0, None, 1e-9])[1] == []  # each finding once


def test_thresholds_are_validated():
    with pytest.raises(ValueError):
        Thresholds(spike_factor=float("nan"))
