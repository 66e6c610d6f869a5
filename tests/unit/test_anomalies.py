"""Anomalies: what is done about a bad step the one judge found (before the update on CPU,
at the flush elsewhere), said once; per-layer gradient flags, judged on host values."""

from __future__ import annotations

import pytest
import torch

from ptdash.anomalies import Anomalies, Thresholds
from ptdash.judge import Judge
from ptdash.shared.events import Warned
from support.journaled import journaled


class _Run:
    """What the anomaly handler is handed: a journal, the pause controls, parameter names, the judge."""

    def __init__(self, action: str = "pause", paused: bool = False, multi: bool = False) -> None:
        self.events: list[tuple[str, str, dict]] = []
        self.pauses: list[tuple[int, str]] = []
        self.requests: list = []
        self.paused = paused
        self.action = action
        self.multi = multi
        self.limits: list[float] = []

    def anomalies(self, thresholds: Thresholds = Thresholds()) -> Anomalies:
        return Anomalies(event=journaled(lambda *event: self.events.append(event)), action=self.action,
                         pause_here=lambda step, reason: self.pauses.append((step, reason)),
                         request_pause=self.requests.append, is_paused=lambda: self.paused or bool(self.requests),
                         names=lambda params: [f"p{i}" for i in range(len(params))],
                         judge=Judge(limit_to=self.limits.append), multi=lambda: self.multi, thresholds=thresholds)


def _healthy(first: int, last: int) -> list[list]:
    return [[s, 0.0, {"loss": 1.0 + 0.01 * (s % 7), "grad/norm_total": 2.0 + 0.01 * (s % 5)}]
            for s in range(first, last + 1)]


def _grads():
    model = torch.nn.Linear(2, 1)
    model(torch.randn(3, 2)).sum().backward()
    return model, torch.optim.SGD(model.parameters(), lr=1.0)


@pytest.mark.parametrize("action", ["pause", "skip", "warn"])
def test_a_cpu_spike_is_acted_on_before_its_update_and_said_once(action):
    run = _Run(action)
    m = run.anomalies()
    m.check_rows(_healthy(1, 100))
    assert run.limits and run.limits[-1] < 2.0 and run.events == []
    model, opt = _grads()
    assert m.judge.at_step(101, [1.02], 2.01) is None
    finding = m.judge.at_step(102, [1.4e9], None)
    assert finding.step == 102 and finding.what == "loss spike"
    m.before_update(opt, 102, None, [], finding)
    (kind, message, data), = run.events
    assert kind == "anomaly" and data["step"] == 102 and data["action"] == action and data["value"] == 1.4e9
    assert message.startswith("loss spike at step 102 (1.4e+09, over the limit ")
    dropped = all(p.grad is None for p in model.parameters())
    assert dropped == (action != "warn")
    assert run.pauses == ([(101, "loss spike")] if action == "pause" else [])
    assert {"pause": "paused before the update, which a resume skips", "skip": "update skipped",
            "warn": "warned only, the update was applied"}[action] in message
    m.check_rows([[101, 0.0, {"loss": 1.02}], [102, 0.0, {"loss": 1.4e9}]])  # the flush: not said again
    assert len(run.events) == 1 and run.requests == []
    assert max(m.judge.loss.values) < 2  # nor learned from


def test_a_gradient_norm_spike_on_cpu_is_found_before_the_update():
    run = _Run("skip")
    m = run.anomalies()
    m.check_rows(_healthy(1, 100))
    assert m.judge.at_step(101, [1.0], 2.02) is None
    finding = m.judge.at_step(102, [1.0], 2.0e4)
    assert finding.what == "gradient norm spike" and finding.value == 2.0e4


def test_under_ddp_a_spike_asks_every_rank_to_pause_and_says_the_update_was_applied():
    run = _Run("pause", multi=True)
    m = run.anomalies()
    m.check_rows(_healthy(1, 100))
    model, opt = _grads()
    m.before_update(opt, 102, None, [], m.judge.at_step(102, [1e6], None))
    (command,) = run.requests
    assert command.name == "pause" and run.pauses == []
    assert all(p.grad is not None for p in model.parameters())  # one rank does not skip alone
    (_, message, data), = run.events
    assert data["applied"] is True and "its update was applied (the ranks pause together" in message


@pytest.mark.parametrize("action", ["warn", "skip"])
def test_a_non_finite_step_seen_at_the_flush_is_reported_once(action):
    run = _Run(action)
    m = run.anomalies()
    m.check_rows([[1, 0.0, {"loss": None}], [2, 0.0, {"grad/norm_total": None}]])
    m.check_rows([[3, 0.0, {"loss": None}]])
    assert [e[1] for e in run.events] == ["non-finite loss or gradient at step 1, seen at the flush; its update "
                                          "was applied"] and run.requests == []
    assert run.events[0][2]["applied"] is True


def test_a_non_finite_step_seen_at_the_flush_pauses_at_the_next_step_under_pause():
    run = _Run("pause")
    m = run.anomalies()
    m.check_rows([[7, 0.0, {"loss": 1.0, "grad/norm_total": None}], [8, 0.0, {"loss": None}]])
    (command,) = run.requests  # one pause, though two steps were bad
    assert command.name == "pause" and command.id == "anomaly-7"
    assert "seen at the flush; its update was applied; pausing at the next step" in run.events[0][1]
    assert run.events[0][2]["action"] == "pause" and len(run.events) == 1


def test_a_gpu_spike_is_judged_at_the_flush_by_the_values_before_it():
    run = _Run("warn")
    m = run.anomalies()
    rows = _healthy(1, 300)
    rows[200][2]["loss"] = 7.1e7
    m.check_rows(rows[:150])
    m.check_rows(rows[150:])
    (_, message, data), = run.events
    assert data["step"] == 201 and message.startswith("loss spike at step 201 (7.1e+07, over the limit")
    assert message.endswith("seen at the flush; its update was applied")


def test_a_step_handled_before_its_update_is_not_reported_again_at_the_flush():
    run = _Run("skip")
    m = run.anomalies()
    model, opt = _grads()
    m.before_update(opt, 5, torch.tensor([1.0, float("nan")]), list(model.parameters()))
    assert all(p.grad is None for p in model.parameters())  # the update is dropped
    (kind, message, data), = run.events
    assert message == "non-finite gradient before the update of step 5, first in p1; update skipped"
    m.check_rows([[5, 0.0, {"loss": None}]])
    assert len(run.events) == 1


def test_pause_before_the_update_blocks_then_drops_it_with_one_event():
    run = _Run("pause")
    m = run.anomalies()
    model, opt = _grads()
    m.before_update(opt, 3, None, list(model.parameters()))
    assert run.pauses == [(2, "the loss")] and all(p.grad is None for p in model.parameters())
    (_, message, _), = run.events
    assert message == ("non-finite gradient before the update of step 3, first in the loss; paused before the "
                       "update, which a resume skips")


def test_layer_flags_name_the_first_affected_layer_and_only_a_vanishing_one_is_said():
    m = _Run().anomalies(Thresholds(warmup_steps=3))
    names = ["a.weight", "a.bias", "b.weight"]
    for step in range(5):
        flags, events = m.check_layers(step, names, [1.0, 1.0, 1.0])
        assert flags == {} and events == []
    flags, events = m.check_layers(6, names, [1.0, None, 1e-9])
    assert flags == {"1": "nonfinite", "2": "vanishing"}
    # The non-finite step is the judge's one event; the flag marks the Layers tab.
    assert [e[1] for e in events] == ["vanishing gradient at step 6: b.weight"]
    assert [e[0] for e in events] == [Warned(flag="vanishing", layer="b.weight", count=1)]
    flags, events = m.check_layers(7, names, [100.0, 1.0, 1.0])  # a jump of 100x its average
    assert flags == {"0": "exploding"} and events == []
    assert m.check_layers(8, names, [1.0, None, 1e-9])[1] == []  # each finding once


def test_an_empty_shard_is_not_a_vanishing_gradient_and_a_shard_is_named_as_one():
    m = _Run().anomalies()
    names = ["0.weight", "4.weight", "4.bias"]
    flags, events = m.check_layers(1, names, [1.0, 0.0, 0.0], held=[True, False, False])
    assert flags == {} and events == []
    flags, events = m.check_layers(2, names, [1.0, 0.0, 1e-9], held=[True, False, True])
    assert flags == {"2": "vanishing"}
    assert [e[1] for e in events] == ["vanishing gradient at step 2: 4.bias (this rank's shard)"]


def test_thresholds_are_validated():
    with pytest.raises(ValueError):
        Thresholds(jump=float("nan"))
