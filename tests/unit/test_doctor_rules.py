"""The doctor's rules in process: the loop shapes a detector must tell apart, driven the way the
engine's hooks drive the doctor (backward, zero_grad, pre/post step, flush), with a tiny CPU model."""

from __future__ import annotations

from pathlib import Path

import pytest

from ptdash.recorder import _to_host
from ptdash.shared.config import RunConfig
from support.journaled import journaled


class _Journal:
    """What the doctor is handed in the engine: a way to journal events, the config, the models."""

    def __init__(self, config=None):
        self.config = RunConfig(**(config or {}))
        self.models = []
        self.events = []

    def add(self, kind, message, data):
        self.events.append({"kind": kind, "message": message, "data": data})

    def doctor(self):
        from ptdash.doctor import Doctor

        return Doctor(journaled(self.add), self.config, lambda: self.models, lambda: 0)

    def found(self):
        return [e["data"]["id"] for e in self.events if e["kind"] == "finding"]


def _loop(shape: str, steps: int = 8, config=None):
    import torch


    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    engine = _Journal(config)
    doctor = engine.doctor()
    doctor.attach()
    try:
        for step in range(1, steps + 1):
            micro = 4 if shape == "accumulate" else 1
            if shape == "discarded_backward":  # e.g. a GAN: another loss's backward reached these params
                doctor.on_backward()
                model(torch.randn(8, 4)).sum().backward()
            if shape in ("accumulate", "zero_first", "discarded_backward"):
                doctor.on_zero_grad(opt)
                opt.zero_grad()
            for _ in range(micro):
                loss = model(torch.randn(8, 4)).pow(2).mean()
                doctor.on_backward()
                loss.backward()
            if shape == "zero_between_keep":
                doctor.on_zero_grad(opt)
                opt.zero_grad(set_to_none=False)
            doctor.on_pre_step(opt, step, [p for p in model.parameters() if p.grad is not None])
            opt.step()
            doctor.on_post_step(opt, step)
            engine.models = [model]
            if shape == "module_zero_after":
                model.zero_grad()
            elif shape == "none_after":
                for p in model.parameters():
                    p.grad = None
            elif shape == "data_zero_after":
                for p in model.parameters():
                    p.grad.data.zero_()
            if shape == "zero_between_keep":
                norms = [float(p.grad.norm()) for p in model.parameters()]
                doctor.on_flush([], [_LayerRow(step, norms)], _to_host)
        doctor.on_flush([], [], _to_host)
    finally:
        doctor.detach()
    return engine


class _LayerRow:
    def __init__(self, step, norms):
        self.step, self.grad_norms, self.params = step, norms, []


@pytest.mark.parametrize("shape", ["zero_first", "accumulate", "module_zero_after", "none_after", "data_zero_after",
                                   "discarded_backward"])
def test_ways_of_clearing_gradients_raise_nothing(shape):
    assert _loop(shape).found() == []


def test_never_clearing_raises_grads_never_cleared_once():
    assert _loop("never").found() == ["grads-never-cleared"]


def test_zero_grad_keeping_zeros_between_backward_and_step_is_confirmed_at_the_flush():
    engine = _loop("zero_between_keep", steps=3)
    assert engine.found() == ["zero-grad-before-step"]
    (finding,) = [e["data"] for e in engine.events if e["kind"] == "finding"]
    assert "all-zero gradients" in finding["what"] and finding["step"] == 1


def test_detect_anomaly_is_switched_on_only_on_request_and_restored():
    import torch


    doctor = _Journal({"detect_anomaly": True}).doctor()
    doctor.attach()
    try:
        assert torch.is_anomaly_enabled()
    finally:
        doctor.detach()
    assert not torch.is_anomaly_enabled()
    doctor = _Journal().doctor()
    doctor.attach()
    assert not torch.is_anomaly_enabled()
    doctor.detach()


def test_plateau_ignores_noise_on_a_falling_loss_and_flags_a_flat_one():
    import random

    from ptdash.doctor.trends import Plateau

    rng = random.Random(0)
    falling = Plateau()
    rows = [[s, 0.0, {"loss": 3.0 * 0.999 ** s * (1 + 0.2 * rng.uniform(-1, 1))}] for s in range(1, 3001)]
    assert falling.add(rows) is None
    flat = Plateau()
    rows = [[s, 0.0, {"loss": 2.3 * (1 + 0.2 * rng.uniform(-1, 1))}] for s in range(1, 3001)]
    found = flat.add(rows)
    assert found and found["stale_steps"] >= 500 and found["step"] < 1000


def test_lr_zero_forgives_a_warmup_that_starts_at_zero():
    from ptdash.doctor.trends import LrZero

    warmup = [[s, 0.0, {"opt/lr/group0": (s - 1) * 1e-4}] for s in range(1, 50)]
    assert LrZero().add(warmup) is None
    zero = [[s, 0.0, {"opt/lr/group0": 1e-3, "opt/lr/group1": 0.0}] for s in range(1, 20)]
    assert LrZero().add(zero) == {"1": (1, 19)}  # the run so far


def test_sync_sampler_counts_lines_that_sync_every_sampled_step():
    import warnings

    from ptdash.doctor.syncs import SyncSampler

    modes = []
    sampler = SyncSampler(first=3, set_mode=modes.append, get_mode=lambda: 0)
    filters = list(warnings.filters)

    def sync(text="called a synchronizing CUDA operation"):
        import sys

        return sampler.on_warning(text, sys._getframe(1))

    results = []
    for step in range(1, 6):
        if sampler.active:
            assert sync()  # a line that syncs every step
            if step == 3:
                assert sync()  # a line that syncs once (a logging step)
            assert not sync("an unrelated warning")
        results.append(sampler.on_post_step(step))
    assert modes == ["warn", 0] and warnings.filters == filters
    found = [r for r in results if r]
    assert len(found) == 1 and found[0]["steps"] == [3, 4] and found[0]["per_step"] == 1
    (line,) = found[0]["lines"]
    assert line["text"] == "assert sync()  # a line that syncs every step" and line["kind"] == "read-back"
    assert sampler.next_start == 30


def test_inplace_crash_under_detect_anomaly_names_the_forward_op():
    import torch


    engine = _Journal({"detect_anomaly": True})
    doctor = engine.doctor()
    doctor.attach()
    try:
        h = torch.randn(4, requires_grad=True)
        y = h.sigmoid()  # the forward op whose output autograd saved
        y.mul_(2)
        with pytest.raises(RuntimeError) as caught:
            y.sum().backward()
        doctor.on_crash(caught.value)
    finally:
        doctor.detach()
    (finding,) = [e["data"] for e in engine.events if e["kind"] == "finding"]
    assert finding["id"] == "inplace-autograd" and "y = h.sigmoid()" in finding["what"]
    line = next(i for i, text in enumerate(Path(__file__).read_text().splitlines(), 1) if "y = h.sigmoid()  #" in text)
    assert finding["forward_source"].endswith(f"test_doctor_rules.py:{line}")
    assert "--detect-anomaly" not in finding["fix"]


def test_ddp_unused_parameter_error_names_the_parameters():
    import torch


    model = torch.nn.ModuleDict({"used": torch.nn.Linear(4, 1), "spare": torch.nn.Linear(4, 1)})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    engine = _Journal()
    engine.models = [model]
    doctor = engine.doctor()
    doctor.attach()
    try:
        model["used"](torch.randn(2, 4)).sum().backward()
        doctor.on_pre_step(opt, 1, [p for p in model.parameters() if p.grad is not None])
        doctor.on_crash(RuntimeError("Expected to have finished reduction in the prior iteration before "
                                     "starting a new one. This error indicates that your module has parameters "
                                     "that were not used in producing loss."))
    finally:
        doctor.detach()
    (finding,) = [e["data"] for e in engine.events if e["kind"] == "finding"]
    assert finding["id"] == "never-learns" and finding["params"] == ["spare.weight", "spare.bias"]


def test_input_bound_blames_only_loader_settings_that_explain_it():
    from ptdash.doctor.data import DataWatch

    found, hints = [], []
    loader = [(4, True, "train.py:9")]
    watch = DataWatch(lambda rule, what, **data: found.append((rule, what, data)), lambda: 0, lambda: loader[0])
    hint = lambda message, data: hints.append(message)  # noqa: E731
    watch.input_bound(0.8, 30, cuda=True, hint=hint)
    assert found == [] and "80%" in hints[0]  # parallel and pinned: only the generic hint is left to say
    assert len(hints) == 1
    loader[0] = (4, False, "train.py:9")
    watch.input_bound(0.8, 30, cuda=True, hint=hint)
    (rule, what, data), = found
    assert rule == "input-bound" and "pin_memory=True" in data["fix"] and "num_workers=" not in data["fix"]
    assert "train.py:9" in what and "__next__" in what  # the training loader, named, and what was timed
    assert len(hints) == 2  # the System tab's line comes with the finding


def test_host_sync_sampling_end_to_end_in_process(monkeypatch):
    """The doctor's CUDA path with the CUDA calls faked: warnings from the script's line are
    counted on the two sampled steps, kept from the output, and raise host-syncs once."""
    import warnings

    import torch

    from ptdash.doctor.syncs import SyncSampler

    modes = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    engine = _Journal()
    doctor = engine.doctor()
    doctor.syncs = SyncSampler(first=3, set_mode=modes.append, get_mode=lambda: 0)
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    shown = []
    monkeypatch.setattr(warnings, "showwarning", lambda *a, **k: shown.append(a))
    doctor.attach()
    doctor._cuda = True
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # as under PYTHONWARNINGS=ignore: sampling must still count
            for step in range(1, 7):
                model(torch.randn(3, 2)).sum().backward()
                doctor.on_pre_step(opt, step, list(model.parameters()))
                opt.step()
                warnings.warn("called a synchronizing CUDA operation")  # loss.item()
                doctor.on_post_step(opt, step)
    finally:
        doctor.detach()
    (finding,) = [e["data"] for e in engine.events if e["kind"] == "finding"]
    assert finding["id"] == "host-syncs" and finding["step"] == 4 and "test_doctor_rules.py:" in finding["source"]
    assert finding["lines"][0]["per_step"] == 1 and modes == ["warn", 0] and shown == []


def test_input_bound_is_one_detector_fed_by_sampled_steps_across_flushes():
    from ptdash.doctor.data import InputBound

    # The data wait is timed on sampled steps only: each flush brings a couple of timed rows.
    detector = InputBound()
    found = []
    for flush in range(12):
        rows = [[s, 0.0, {"loss": 1.0, "time/step_s": 0.1, **({"time/data_s": 0.08} if s % 16 == 0 else {})}]
                for s in range(flush * 32 + 1, flush * 32 + 33)]
        found.append(detector.add(rows))
    first = next(i for i, f in enumerate(found) if f)
    assert first == 9  # the 20th timed step arrives in the tenth flush
    share, steps = found[first]
    assert share == pytest.approx(0.8) and steps == 20
    assert not any(found[first + 1:])  # it fires once


def test_a_loop_that_does_not_wait_for_data_is_not_input_bound():
    from ptdash.doctor.data import InputBound

    detector = InputBound()
    rows = [[s, 0.0, {"time/step_s": 0.1, "time/data_s": 0.01}] for s in range(1, 200)]
    assert detector.add(rows) is None
