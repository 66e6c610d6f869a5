"""What the real hooks record each step, against a direct computation in the script.

The engine runs in this process (hooks attached to torch, as under ``ptdash``) with its
flusher stopped, so the test drains the recorder itself and sees every step's record.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ptdash.doctor import WATCH_EVERY, WATCH_FIRST
from ptdash.engine import Engine
from ptdash.shared import rundir
from ptdash.shared.config import RunConfig


@pytest.fixture
def engine(tmp_path):
    # skip: a non-finite step drops its update and training goes on (pause would wait for a dashboard).
    config = RunConfig(update_ratio_every=3, on_anomaly="skip")
    engine = Engine(rundir.create(tmp_path, "stats", config=config), config)
    engine.start()
    engine.flusher.stop()  # the test drains the recorder itself
    try:
        yield engine
    finally:
        engine.finish("finished", 0)


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


def _train(model, opt, steps: int, loss_at=lambda step, loss: loss, clear=lambda step: True) -> None:
    """A plain loop; ``loss_at`` may change (or look at) each step's loss, ``clear`` skip zero_grad."""
    x = torch.randn(8, 6)
    for step in range(1, steps + 1):
        if clear(step):
            opt.zero_grad()
        loss_at(step, model(x).pow(2).mean()).backward()
        opt.step()


def test_every_statistic_matches_a_direct_computation(engine):
    model = _model()
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    x, y = torch.randn(8, 6), torch.randn(8, 3)
    expected = {}
    for step in range(1, 8):
        opt.zero_grad()
        losses = []
        for half in (x[:4], x[4:]):  # two micro-batches, their losses summed by ptdash
            loss = (model(half) - y[:4]).pow(2).mean()
            loss.backward()
            losses.append(loss.detach())
        grads = [p.grad.clone() for p in params]
        lr = opt.param_groups[0]["lr"]
        before = [p.detach().clone() for p in params]
        opt.step()
        sched.step()
        expected[step] = {
            "loss": float(losses[0] + losses[1]),
            "total": float(torch.nn.utils.get_total_norm(grads)),
            "per": [float(torch.linalg.vector_norm(g)) for g in grads],
            "ratio": [float((p.detach() - b).norm() / b.norm()) for p, b in zip(params, before)],
            "lr": lr,
        }
    rows, layer_rows = engine.recorder.drain(wanted=set(expected))
    assert [r[0] for r in rows] == list(expected) == [r.step for r in layer_rows]
    for (step, _, values), layer in zip(rows, layer_rows):
        want = expected[step]
        assert values["loss"] == want["loss"] and values["loss/micro_batches"] == 2.0
        assert values["grad/norm_total"] == want["total"]
        assert values["opt/lr/group0"] == want["lr"]
        assert layer.params == params and layer.grad_norms == want["per"]
        if step % 3 == 0:  # sampled every 3 steps here
            assert layer.update_ratios == pytest.approx(want["ratio"], rel=1e-6)
        else:
            assert layer.update_ratios is None
        assert "grad/clip_max" not in values and "grad/clipped" not in values
        assert values["time/step_s"] > 0
        if step == 1:  # the model is found at the end of the first step: no forward timing yet
            assert "time/compute_s" not in values
            continue
        parts = ("time/data_s", "time/compute_s", "time/optim_s", "time/other_s")
        assert sum(values[p] for p in parts) == pytest.approx(values["time/step_s"], abs=1e-6)
        assert values["throughput/samples_per_s"] == pytest.approx(8 / values["time/step_s"])
    assert [r[2]["opt/lr/group0"] for r in rows] == [0.05, 0.05, 0.025, 0.025, 0.0125, 0.0125, 0.00625]


def test_clipping_records_the_pre_clip_norm_and_whether_it_clipped(engine):
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(8, 6)
    returned = []
    for scale in (1.0, 1000.0, 1.0):
        opt.zero_grad()
        (model(x).pow(2).mean() * scale).backward()
        returned.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)))
        opt.step()
    rows, _ = engine.recorder.drain()
    assert [r[2]["grad/norm_total"] for r in rows] == returned
    assert [r[2]["grad/clip_max"] for r in rows] == [0.5] * 3
    assert [r[2]["grad/clipped"] for r in rows] == [float(n > 0.5) for n in returned]
    assert rows[1][2]["grad/clipped"] == 1.0


def test_only_the_newest_and_the_telling_steps_convert_their_layers(engine):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    # Step 5 is non-finite: its layers name the culprit.
    _train(model, opt, 8, loss_at=lambda step, loss: loss * float("nan") if step == 5 else loss)
    rows, layer_rows = engine.recorder.drain(wanted={2})
    # Wanted (2), update ratios (every 3rd), non-finite (5), newest (8).
    assert [r.step for r in layer_rows] == [2, 3, 5, 6, 8]
    assert rows[4][2]["loss"] is None and all(n is None for n in layer_rows[2].grad_norms)
    assert all(torch.isfinite(p).all() for p in model.parameters())  # step 5's update was skipped
    assert all(r[2]["loss"] is not None for r in rows[5:])


def test_forward_timing_runs_on_the_watched_steps_only(engine):
    model = _model()
    last = WATCH_FIRST + 2 * WATCH_EVERY
    _train(model, torch.optim.SGD(model.parameters(), lr=0.01), last)
    rows, _ = engine.recorder.drain()
    timed = [step for step, _, values in rows if "time/compute_s" in values]
    assert timed == [*range(2, WATCH_FIRST + 1), WATCH_FIRST + WATCH_EVERY, last]
    assert all("time/step_s" in values and "loss" in values for _, _, values in rows)


def test_logged_values_join_the_next_step(engine):
    import ptdash

    model = _model()
    logged = []

    def log_at_step_2(step, loss):
        if step == 2:
            ptdash.log(val_loss=loss.detach() * 2, acc=0.75)  # a device tensor and a float
            logged.append(float(loss.detach() * 2))
        return loss

    _train(model, torch.optim.SGD(model.parameters(), lr=0.01), 3, loss_at=log_at_step_2)
    rows, _ = engine.recorder.drain()
    assert rows[1][2]["user/val_loss"] == logged[0] and rows[1][2]["user/acc"] == 0.75
    assert not any(k.startswith("user/") for r in (rows[0], rows[2]) for k in r[2])


def test_a_param_group_added_mid_run_is_measured(engine):
    model, extra = _model(), nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(8, 6)
    for step in range(1, 5):
        if step == 3:
            opt.add_param_group({"params": list(extra.parameters()), "lr": 0.1})
        opt.zero_grad()
        out = model(x)
        if step >= 3:
            out = extra(out)
        out.pow(2).mean().backward()
        grads = [p.grad.clone() for g in opt.param_groups for p in g["params"]]
        opt.step()
    rows, layer_rows = engine.recorder.drain(wanted={1, 2, 3, 4})
    assert [len(r.grad_norms) for r in layer_rows] == [4, 4, 6, 6]
    assert layer_rows[-1].grad_norms == [float(torch.linalg.vector_norm(g)) for g in grads]
    assert rows[-1][2]["grad/norm_total"] == float(torch.nn.utils.get_total_norm(grads))
    assert rows[-1][2]["opt/lr/group1"] == 0.1


def test_a_bug_that_starts_late_is_caught_on_the_sampled_steps(engine):
    from ptdash.shared.reader import StoreReader

    model = _model()
    start = WATCH_FIRST + 20  # past the steps watched one by one; then no more zero_grad
    _train(model, torch.optim.SGD(model.parameters(), lr=1e-3), start + 4 * WATCH_EVERY, clear=lambda s: s < start)
    engine.flusher.flush()
    with StoreReader(engine.run_dir / "metrics.db") as store:
        findings = [e for e in store.events() if e.kind == "finding"]
    assert [f.data["id"] for f in findings] == ["grads-never-cleared"]
    assert findings[0].data["step"] > start and findings[0].data["step"] % WATCH_EVERY == 0
