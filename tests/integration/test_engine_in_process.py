"""The real Engine inside this process, as benchmarks and embedding code drive it."""

from __future__ import annotations

import torch

from ptdash.engine import Engine
from ptdash.shared import rundir
from ptdash.shared.config import RunConfig


def _train(steps: int) -> None:
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.ones(3, 4)).sum().backward()
        opt.step()


def test_attaching_the_hooks_twice_still_counts_each_step_once(tmp_path):
    engine = Engine(rundir.create(tmp_path, "twice"), RunConfig())
    engine.start()
    try:
        engine.hooks.attach()  # already attached by start()
        _train(5)
        assert engine.hooks.step == 5
        engine.hooks.detach()
        _train(2)  # detached: not seen
        assert engine.hooks.step == 5
        engine.hooks.attach()
        _train(1)
        assert engine.hooks.step == 6
    finally:
        engine.finish("finished", 0)
