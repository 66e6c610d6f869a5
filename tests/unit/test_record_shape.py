"""A StepRecord of the wrong shape fails where the training thread builds it, on each path
that builds one, before the flusher could take it (where its flush's rows would be lost).

The records are built from a tuple of all their fields, without a Python frame
(stepend.py), and each builder checks the length it built. Here the field count the
builders are checked against is moved by one, as when StepRecord gains a field its
builders do not fill (+1) or a builder gives a field StepRecord lacks (-1).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ptdash import stepend
from ptdash.engine import Engine
from ptdash.recorder import RECORD_FIELDS, RecordShapeError
from ptdash.shared import rundir
from ptdash.shared.config import RunConfig


@pytest.fixture
def engine(tmp_path):
    engine = Engine(rundir.create(tmp_path, "shape"), RunConfig())
    engine.start()
    engine.flusher.stop()  # the records stay in the recorder, where the test counts them
    try:
        yield engine
    finally:
        engine.finish("finished", 0)


class Gan:
    """A discriminator (the main optimizer, the first to step) and a generator."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.d, self.g = nn.Linear(4, 1), nn.Linear(2, 4)
        self.opt_d = torch.optim.SGD(self.d.parameters(), lr=0.1)
        self.opt_g = torch.optim.SGD(self.g.parameters(), lr=0.1)

    def backward(self, opt) -> None:
        opt.zero_grad()
        if opt is self.opt_d:
            self.d(torch.randn(8, 4)).pow(2).mean().backward()
        else:
            self.d(self.g(torch.randn(8, 2))).mean().backward()

    def step(self, generator: bool = True) -> None:
        for opt in (self.opt_d, self.opt_g) if generator else (self.opt_d,):
            self.backward(opt)
            opt.step()


@pytest.mark.parametrize("moved", [+1, -1])
@pytest.mark.parametrize("path", ["main", "main lean", "other", "other lean"])
def test_a_record_of_the_wrong_shape_fails_at_its_construction(engine, monkeypatch, path, moved):
    gan, state = Gan(), engine.hooks.state
    gan.step(generator=path != "other")  # without it, the generator's next step is its first
    if path.endswith("lean"):
        engine.budget.every = 4  # as the budget's decision would: one step in four sampled
        for _ in range(200):  # past the doctor's watched first steps, to a step decided lean
            if id(gan.opt_d) in state.lean:
                break
            gan.step()
        assert id(gan.opt_d) in state.lean and id(gan.opt_g) in state.lean
    else:
        assert not state.lean  # every step sampled: the full path
    opt = gan.opt_d if path.startswith("main") else gan.opt_g
    if opt is gan.opt_g:
        gan.step(generator=False)  # the main step first, built right
        assert (id(gan.opt_g) in state.lean) == path.endswith("lean")
    gan.backward(opt)
    recorded = len(engine.recorder)
    with monkeypatch.context() as patched:
        patched.setattr(stepend, "RECORD_FIELDS", RECORD_FIELDS + moved)
        with pytest.raises(RecordShapeError, match=f"built with {RECORD_FIELDS} fields where it has "
                                                   f"{RECORD_FIELDS + moved} "):
            opt.step()
    assert len(engine.recorder) == recorded  # nothing of the wrong shape reached the flusher
