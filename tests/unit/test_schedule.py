"""The schedule ahead: each torch scheduler's simulated copy against the real scheduler, exactly.

Each case builds an optimizer and scheduler, steps them a while as a script would, asks
for the preview, then steps the real scheduler to the end of the preview and compares
every LR (``==``, not approximately). A twin that was never previewed steps alongside, so
the script's scheduler and optimizer are shown to continue bit-identically.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch
from torch.optim import lr_scheduler as L

from ptdash import schedule

WARM = 7
"""Real steps taken before the preview, so the copy starts mid-schedule."""

AHEAD = 300
"""Steps previewed (to the end, for the schedulers that end sooner)."""

WARMUP = 10


def warmup_cosine(step: int, warmup: int, total: int) -> float:
    """The shape of a Hugging Face ``get_cosine_schedule_with_warmup`` lambda."""
    if step < warmup:
        return float(step) / float(max(1, warmup))
    progress = float(step - warmup) / float(max(1, total - warmup))
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))


def _warm(step):
    return min(1.0, (step + 1) / WARMUP)


CASES = {
    "OneCycleLR": lambda o: L.OneCycleLR(o, max_lr=[0.1, 0.01], total_steps=200),
    "OneCycleLR-linear": lambda o: L.OneCycleLR(o, max_lr=0.1, total_steps=120, anneal_strategy="linear",
                                                three_phase=True),
    "CosineAnnealingLR": lambda o: L.CosineAnnealingLR(o, T_max=150, eta_min=1e-5),
    "CosineAnnealingWarmRestarts": lambda o: L.CosineAnnealingWarmRestarts(o, T_0=20, T_mult=2, eta_min=1e-4),
    "StepLR": lambda o: L.StepLR(o, step_size=30, gamma=0.5),
    "MultiStepLR": lambda o: L.MultiStepLR(o, milestones=[20, 50, 51, 200], gamma=0.3),
    "ExponentialLR": lambda o: L.ExponentialLR(o, gamma=0.99),
    "LinearLR": lambda o: L.LinearLR(o, start_factor=0.01, end_factor=1.0, total_iters=40),
    "ConstantLR": lambda o: L.ConstantLR(o, factor=0.2, total_iters=25),
    "PolynomialLR": lambda o: L.PolynomialLR(o, total_iters=180, power=2.0),
    "CyclicLR": lambda o: L.CyclicLR(o, base_lr=1e-4, max_lr=[0.1, 0.05], step_size_up=15, mode="triangular2"),
    "CyclicLR-exp": lambda o: L.CyclicLR(o, base_lr=1e-4, max_lr=0.1, step_size_up=9, step_size_down=4,
                                         mode="exp_range", gamma=0.999),
    "SequentialLR": lambda o: L.SequentialLR(o, [L.LinearLR(o, 0.1, total_iters=20),
                                                 L.CosineAnnealingLR(o, T_max=200)], milestones=[20]),
    "ChainedScheduler": lambda o: L.ChainedScheduler([L.ConstantLR(o, factor=0.5, total_iters=30),
                                                      L.ExponentialLR(o, gamma=0.995)]),
    "LambdaLR": lambda o: L.LambdaLR(o, lambda step: min(1.0, (step + 1) / WARMUP) * 0.999 ** step),
    "LambdaLR-partial": lambda o: L.LambdaLR(o, functools.partial(warmup_cosine, warmup=20, total=250)),
    "LambdaLR-per-group": lambda o: L.LambdaLR(o, [_warm, lambda s: 0.98 ** s]),
    "MultiplicativeLR": lambda o: L.MultiplicativeLR(o, lambda step: 0.97 if step % 10 else 1.0),
}


def setup(make):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD([{"params": [model.weight]}, {"params": [model.bias], "lr": 0.02}], lr=0.1,
                          momentum=0.9)
    return model, opt, make(opt)


def step(model, opt, sched) -> list[float] | None:
    """One training step as a script takes it; the LRs the scheduler then set (None: it ended)."""
    opt.zero_grad()
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    try:
        sched.step()
    except ValueError:  # OneCycleLR past its total
        return None
    return [float(v) for v in sched.get_last_lr()]


@pytest.mark.parametrize("name", list(CASES))
def test_preview_is_what_the_scheduler_then_does(name):
    real = setup(CASES[name])
    twin = setup(CASES[name])  # never previewed: what the script would do without ptdash
    for _ in range(WARM):
        assert step(*real) == step(*twin)
    assert schedule.why_not(real[2]) is None
    preview, ended = schedule.simulate(real[2], AHEAD)
    assert preview[0] == [float(v) for v in real[2].get_last_lr()]
    actual = [preview[0]]
    for _ in range(AHEAD):
        lrs = step(*real)
        assert lrs == step(*twin), "the previewed scheduler must continue bit-identically"
        if lrs is None:
            break
        actual.append(lrs)
    assert actual == preview  # exactly, to its end
    assert ended == (len(actual) < AHEAD + 1)
    _, opt, sched = real
    _, opt2, sched2 = twin
    assert [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups] == \
        [{k: v for k, v in g.items() if k != "params"} for g in opt2.param_groups]
    assert {k: v for k, v in sched.state_dict().items() if k != "_schedulers"} == \
        {k: v for k, v in sched2.state_dict().items() if k != "_schedulers"}
    assert torch.equal(real[0].weight, twin[0].weight)


def test_one_cycle_ends_where_the_real_one_refuses_to_step():
    model, opt, sched = setup(lambda o: L.OneCycleLR(o, max_lr=0.1, total_steps=50))
    preview, ended = schedule.simulate(sched, 1000)
    assert ended and len(preview) == 51  # the LRs after 0..50 steps; the 51st step raises
    assert schedule.natural_end(sched) == 50


def test_the_copy_never_touches_the_script_objects():
    model, opt, sched = setup(lambda o: L.OneCycleLR(o, max_lr=0.1, total_steps=100))
    groups = [dict(g) for g in opt.param_groups]
    step_fn = opt.step
    copy_ = schedule.twin(sched)
    assert copy_.optimizer is not opt and copy_.optimizer.param_groups[0]["params"] == []
    for _ in range(20):
        copy_.step()
    assert [dict(g) for g in opt.param_groups] == groups  # momentum (cycled by OneCycle) too
    assert opt.step is step_fn and sched.optimizer is opt and sched.last_epoch == 0


def test_the_copy_starts_from_the_scheduler_lr_not_the_scaled_group():
    """While the optimizer steps, ptdash's LR factor is multiplied into the groups."""
    model, opt, sched = setup(lambda o: L.ExponentialLR(o, gamma=0.5))
    for group in opt.param_groups:
        group["lr"] *= 10  # as the hooks do, between the step's pre and post hooks
    preview, _ = schedule.simulate(sched, 2)
    assert preview == [[0.1, 0.02], [0.05, 0.01], [0.025, 0.005]]


def test_unsupported_schedulers_say_why():
    _, _, plateau = setup(lambda o: L.ReduceLROnPlateau(o))
    assert "metric" in schedule.why_not(plateau)

    class Custom(L.StepLR):
        pass

    _, _, custom = setup(lambda o: Custom(o, step_size=3))
    assert "Custom" in schedule.why_not(custom)
    seen = []
    _, _, impure = setup(lambda o: L.LambdaLR(o, lambda s: seen.append(s) or 1.0))
    calls = len(seen)
    assert "side effects" in schedule.why_not(impure)
    assert len(seen) == calls  # judged by reading it, never by calling it


SEEN: list = []
SCALE = 0.5


def _records(step):
    SEEN.append(step)
    return 1.0


def _global_write(step):
    global SCALE
    SCALE = step
    return 1.0


def _reads_constant(step):
    return SCALE ** step


@pytest.mark.parametrize("fn, expected", [
    (lambda s: 1.0, True),
    (lambda s: math.cos(s / 10) * 0.5 + 0.5, True),
    (functools.partial(warmup_cosine, warmup=5, total=50), True),
    (_reads_constant, True),
    (_warm, True),
    (_records, False),
    (_global_write, False),
    (print, False),
    (functools.partial(warmup_cosine, warmup=[5], total=50), False),
    (lambda s: SEEN.append(s), False),
    (lambda s: open("x"), False),
])
def test_pure(fn, expected):
    assert schedule.pure(fn) is expected


def test_natural_ends():
    assert schedule.natural_end(setup(CASES["CosineAnnealingLR"])[2]) == 150
    assert schedule.natural_end(setup(CASES["PolynomialLR"])[2]) == 180
    assert schedule.natural_end(setup(CASES["SequentialLR"])[2]) == 220
    assert schedule.natural_end(setup(CASES["StepLR"])[2]) is None
    assert schedule.natural_end(setup(CASES["LinearLR"])[2]) is None
