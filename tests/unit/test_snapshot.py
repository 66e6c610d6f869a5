"""The rollback snapshot (engine/snapshot.py): restored in place, bit for bit."""

import random

import torch

from ptdash.snapshot import Snapshot


def _train(model, opt, sched, steps, scale=1.0):
    for _ in range(steps):
        x = torch.randn(16, 4) * scale
        loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()


def _objects():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=100)
    return model, opt, sched


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def test_a_restore_is_bit_identical_to_the_snapshot_and_keeps_the_scripts_objects():
    model, opt, sched = _objects()
    _train(model, opt, sched, 5)
    expected = {"model": {k: v.clone() for k, v in model.state_dict().items()},
                "opt": {"state": {i: {k: v.clone() for k, v in s.items()} for i, s in opt.state_dict()["state"].items()},
                        "param_groups": [dict(g) for g in opt.state_dict()["param_groups"]]},
                "sched": dict(sched.state_dict()), "torch_rng": torch.get_rng_state(), "py_rng": random.getstate()}
    snap = Snapshot()
    structure, sources = Snapshot.gather([model], [opt], [sched], [])
    snap.take(5, structure, sources)
    assert snap.nbytes == Snapshot.needed(sources) > 0
    params = list(model.parameters())
    momentum = [opt.state[p]["momentum_buffer"] for p in params]
    _train(model, opt, sched, 3, scale=1e4)  # a wild batch ruins the weights
    random.random()
    assert not _same(expected["model"], model.state_dict())
    snap.restore([model], [opt], [sched], [])
    assert _same(expected["model"], model.state_dict())
    assert _same(expected["opt"], opt.state_dict())
    assert _same(expected["sched"], sched.state_dict())
    assert torch.equal(expected["torch_rng"], torch.get_rng_state()) and random.getstate() == expected["py_rng"]
    assert _same(snap.tensors()["models"]["Sequential"], model.state_dict())
    # The script's objects keep their identity; the optimizer's state is its own, not the buffers.
    assert list(model.parameters()) == params and all(a is b for a, b in zip(model.parameters(), params))
    assert opt.param_groups[0]["params"][0] is params[0]
    assert not any(opt.state[p]["momentum_buffer"].data_ptr() == b.data_ptr() for p in params for b in snap.buffers)
    assert momentum  # the old buffers were replaced by the restored copies
    # Training on after the restore does not write into the snapshot.
    before = [b.clone() for b in snap.buffers]
    _train(model, opt, sched, 2)
    assert all(torch.equal(a, b) for a, b in zip(before, snap.buffers))


def test_a_second_take_reuses_the_buffers():
    model, opt, sched = _objects()
    _train(model, opt, sched, 2)
    snap = Snapshot()
    snap.take(2, *Snapshot.gather([model], [opt], [sched], []))
    ptrs = [b.data_ptr() for b in snap.buffers]
    _train(model, opt, sched, 2)
    snap.take(4, *Snapshot.gather([model], [opt], [sched], []))
    assert [b.data_ptr() for b in snap.buffers] == ptrs and snap.step == 4
    assert _same(snap.tensors()["models"]["Sequential"], model.state_dict())


def test_a_restore_refuses_objects_that_changed_and_changes_nothing():
    model, opt, sched = _objects()
    _train(model, opt, sched, 2)
    snap = Snapshot()
    snap.take(2, *Snapshot.gather([model], [opt], [sched], []))
    other = torch.nn.Linear(4, 1)
    try:
        snap.restore([model], [opt, torch.optim.SGD(other.parameters(), lr=0.1)], [sched], [])
    except ValueError as exc:
        assert "changed since the snapshot" in str(exc)
    else:
        raise AssertionError("a restore into other objects was not refused")


def test_a_grad_scaler_is_restored_without_its_state_dict():
    model, opt, sched = _objects()
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    x = torch.randn(8, 4)
    loss = model(x).pow(2).mean()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    snap = Snapshot()
    snap.take(1, *Snapshot.gather([model], [opt], [sched], [scaler]))
    scale = scaler._scale.clone()
    scaler._scale.fill_(1.0)
    scaler._growth_factor = 3.0
    snap.restore([model], [opt], [sched], [scaler])
    assert torch.equal(scaler._scale, scale) and scaler._growth_factor == 2.0
