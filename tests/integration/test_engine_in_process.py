"""The real Engine inside this process, as benchmarks and embedding code drive it."""

from __future__ import annotations

import logging

import pytest
import torch

from ptdash.engine import Engine
from ptdash.shared import rundir
from ptdash.shared.config import RunConfig
from ptdash.shared.reader import StoreReader
from ptdash.tracked import HANDOVER_STEPS


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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_every_steps_loss_is_stored_as_the_script_computed_it_when_steps_are_thinned(tmp_path, dtype):
    # A budget no step can meet: after the learning steps nearly every step takes the lean
    # path, whose loss the training thread reads itself (float64 ones are left to the flush).
    run_dir = rundir.create(tmp_path, "losses")
    engine = Engine(run_dir, RunConfig(overhead_budget=0.001))
    engine.start()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).to(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = torch.randn(16, 4, dtype=dtype), torch.randn(16, 1, dtype=dtype)
    seen, thinned_at = [], None
    try:
        # Until the flusher has thinned the sampling (a few flushes in), then 200 steps more.
        while thinned_at is None or len(seen) < thinned_at + 200:
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            seen.append(loss.detach().float().item())  # what the store keeps: the float32 reading
            if thinned_at is None and engine.budget.every > 1:
                thinned_at = len(seen)
            assert len(seen) < 1_000_000, "the budget never thinned the sampling"
    finally:
        engine.finish("finished", 0)
    with StoreReader(run_dir / "metrics.db") as store:
        steps, values = store.series("loss")
    assert steps == list(range(1, len(seen) + 1))
    assert values == seen


def test_thinned_fast_steps_are_flushed_once_a_second_and_flush_now_stores_them(tmp_path):
    # Each flush has a fixed cost whatever it holds; while the budget thins, one a second.
    from ptdash.flusher import INTERVAL_S, THINNED_INTERVAL_S

    run_dir = rundir.create(tmp_path, "cadence")
    engine = Engine(run_dir, RunConfig(overhead_budget=0.001))
    engine.start()
    try:
        assert engine.budget.every == 1 and engine.flusher.wait_s() == INTERVAL_S
        steps = 0
        while engine.budget.every == 1:
            _train(1)
            steps += 1
            assert steps < 1_000_000, "the budget never thinned the sampling"
        assert engine.flusher.wait_s() == THINNED_INTERVAL_S
        _train(7)
        assert engine.flusher.flush_now(timeout=60)
        with StoreReader(run_dir / "metrics.db") as store:
            assert store.last_step() == steps + 7  # every step so far, without waiting a second
    finally:
        engine.finish("finished", 0)


def test_a_flush_interval_the_user_set_is_kept_while_the_budget_thins(tmp_path):
    engine = Engine(rundir.create(tmp_path, "set"), RunConfig(overhead_budget=0.001, flush_interval=0.1))
    try:
        engine.budget.every = 8
        assert engine.flusher.wait_s() == 0.1
        engine.hooks.state.last_step_s = 0.05  # slow steps: four to a flush
        assert engine.flusher.wait_s() == pytest.approx(0.2)
        engine.hooks.state.last_step_s = 2.0
        assert engine.flusher.wait_s() == 1.0  # at most a second, however slow
    finally:
        engine.finish("finished", 0)


def test_a_run_shorter_than_a_reading_still_has_its_cost_figure(tmp_path):
    # The last reading is taken after the last drain: a run whose steps all reach the
    # flusher at its final flush (a short DDP rank) showed "ptdash: N/A".
    run_dir = rundir.create(tmp_path, "short")
    engine = Engine(run_dir, RunConfig())
    engine.start()
    engine.flusher.stop()  # no flush until the run's last: every step is drained there
    try:
        _train(20)
    finally:
        engine.finish("finished", 0)
    with StoreReader(run_dir / "metrics.db") as store:
        assert store.last_step() == 20
        shares = [v for v in store.sampled("ptdash/step_pct")[1] if v is not None]
    assert shares and all(0 < v < 100 for v in shares)


def _manual_training(engine, clip: float | None, plant_nan: bool = False):
    """Optimizer-less training (``p -= lr * p.grad``, the PyTorch tutorials' loop) until the
    budget has thinned the sampling, then 300 steps more (one in k <= 256 is sampled among
    any 300, however busy the machine and so sparse the sampling); a NaN loss planted, if asked, on
    the 50th of them (a step the period in force does not sample). Returns the losses the
    script computed, the step thinning began after, the planted step and whether the
    parameters stayed finite after it."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    seen, thinned_at, planted, finite = [], None, None, True
    while thinned_at is None or len(seen) < thinned_at + 300:
        step = len(seen) + 1
        loss = torch.nn.functional.mse_loss(model(x), y)
        if plant_nan and planted is None and thinned_at is not None and step >= thinned_at + 50 \
                and step % engine.budget.every:
            loss, planted = loss * float("nan"), step
        model.zero_grad()
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(p.grad, alpha=-0.05)
        if planted == step:
            finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
        seen.append(loss.detach().float().item())
        if thinned_at is None and engine.budget.every > 1:
            thinned_at = len(seen)
        assert len(seen) < 1_000_000, "the budget never thinned the sampling"
    return seen, thinned_at, planted, finite


def test_training_without_an_optimizer_is_thinned_by_the_budget_and_keeps_every_loss(tmp_path):
    run_dir = rundir.create(tmp_path, "manual")
    engine = Engine(run_dir, RunConfig(overhead_budget=0.001))
    engine.start()
    try:
        seen, thinned_at, _, _ = _manual_training(engine, clip=None)
    finally:
        engine.finish("finished", 0)
    with StoreReader(run_dir / "metrics.db") as store:
        steps, values = store.series("loss")
        normed = store.series("grad/norm_total")[0]
    assert steps == list(range(1, len(seen) + 1)) and values == seen
    assert set(range(1, 65)) <= set(normed)  # the budget's learning steps: all sampled
    late = [s for s in normed if s > thinned_at + 1]
    assert 0 < len(late) <= 150 and all(s % 2 == 0 for s in late), late  # one step in k >= 2


def test_training_without_an_optimizer_keeps_every_norm_its_own_clip_measures(tmp_path):
    # The script's clip_grad_norm_ measures the norms each step anyway: thinning drops none.
    run_dir = rundir.create(tmp_path, "manual-clip")
    engine = Engine(run_dir, RunConfig(overhead_budget=0.001))
    engine.start()
    try:
        seen, thinned_at, _, _ = _manual_training(engine, clip=0.5)
    finally:
        engine.finish("finished", 0)
    with StoreReader(run_dir / "metrics.db") as store:
        steps = store.series("loss")[0]
        normed, norms = store.series("grad/norm_total")
        clip_max = store.series("grad/clip_max")[1]
    assert thinned_at < len(seen) and steps == normed == list(range(1, len(seen) + 1))
    assert all(n > 0 for n in norms) and set(clip_max) == {0.5}


def test_a_nan_loss_on_an_unsampled_inferred_step_is_caught_before_the_scripts_update(tmp_path):
    run_dir = rundir.create(tmp_path, "manual-nan")
    engine = Engine(run_dir, RunConfig(overhead_budget=0.001, on_anomaly="skip"))
    engine.start()
    try:
        _, _, planted, finite = _manual_training(engine, clip=None, plant_nan=True)
    finally:
        engine.finish("finished", 0)
    assert planted is not None and finite  # its gradients were zeroed before `p -= lr * p.grad`
    with StoreReader(run_dir / "metrics.db") as store:
        anomalies = [e for e in store.events() if e.kind == "anomaly"]
        normed = store.series("grad/norm_total")[0]
    assert planted not in normed  # the step really was not sampled
    assert anomalies[0].data["step"] == planted and anomalies[0].data["layer"] == "the loss"
    assert "update skipped" in anomalies[0].message


def test_a_gans_two_optimizers_both_take_the_lean_path_and_keep_every_loss_and_lr(tmp_path):
    # A budget no step can meet: past the learning steps both optimizers' unsampled steps go
    # lean. Each keeps its loss and LR every step, its norms on the sampled steps only, and a
    # NaN generator loss on an unsampled step is still caught before the generator's update.
    run_dir = rundir.create(tmp_path, "gan")
    engine = Engine(run_dir, RunConfig(overhead_budget=0.001, on_anomaly="skip"))
    engine.start()
    torch.manual_seed(0)
    gen = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    disc = torch.nn.Sequential(torch.nn.Linear(2, 16), torch.nn.LeakyReLU(0.2), torch.nn.Linear(16, 1))
    opt_d = torch.optim.Adam(disc.parameters(), lr=4e-4)
    opt_g = torch.optim.Adam(gen.parameters(), lr=1e-4)
    bce = torch.nn.BCEWithLogitsLoss()
    real, ones, zeros = torch.randn(32, 2), torch.ones(32, 1), torch.zeros(32, 1)
    d_seen, g_seen, both_lean, thinned_at, planted = [], [], False, None, None
    try:
        while thinned_at is None or len(d_seen) < thinned_at + 300:
            fake = gen(torch.randn(32, 4))
            opt_d.zero_grad()
            d_loss = bce(disc(real), ones) + bce(disc(fake.detach()), zeros)
            d_loss.backward()
            opt_d.step()
            step = len(d_seen) + 1
            opt_g.zero_grad()
            g_loss = bce(disc(fake), ones)
            if planted is None and thinned_at is not None and step >= thinned_at + 100 and \
                    (step + 1) % engine.budget.every and len(engine.hooks.state.lean) == 2:
                g_loss, planted = g_loss * float("nan"), step
                before = [p.detach().clone() for p in gen.parameters()]
            g_loss.backward()
            opt_g.step()
            if planted == step:
                assert all(torch.equal(a, b) for a, b in zip(before, gen.parameters()))  # skipped
            d_seen.append(d_loss.detach().float().item())
            g_seen.append(g_loss.detach().float().item())
            both_lean = both_lean or len(engine.hooks.state.lean) == 2
            if thinned_at is None and engine.budget.every > 1:
                thinned_at = len(d_seen)
            assert len(d_seen) < 1_000_000, "the budget never thinned the sampling"
    finally:
        engine.finish("finished", 0)
    assert both_lean and planted is not None
    every_step = list(range(1, len(d_seen) + 1))
    with StoreReader(run_dir / "metrics.db") as store:
        assert store.series("loss") == (every_step, d_seen)
        g_steps, g_values = store.series("opt1/loss")
        assert g_steps == every_step
        assert g_values == [None if i == planted - 1 else v for i, v in enumerate(g_seen)]
        assert store.series("opt/lr/group0") == (every_step, [4e-4] * len(d_seen))
        assert store.series("opt1/lr/group0") == (every_step, [1e-4] * len(d_seen))
        # One step in k >= 2 sampled; the generator's step after main step N is sampled with
        # main step N + 1 (both read the step counter before its increment), stored at N.
        for name, shift in (("grad/norm_total", 0), ("opt1/grad/norm_total", 1)):
            late = [s for s in store.series(name)[0] if s > thinned_at + 1]
            assert 0 < len(late) <= 150 and all((s + shift) % 2 == 0 for s in late), (name, late)
        anomalies = [e for e in store.events() if e.kind == "anomaly"]
        assert not [e for e in store.events() if "main optimizer" in e.message]  # D stays the main one
    assert anomalies[0].data["step"] == planted + 1 and "update skipped" in anomalies[0].message


def _until_thinned(engine, more: int):
    """0, 1, 2, ...: until the budget has thinned the sampling, then ``more`` more."""
    i, thinned_at = 0, None
    while thinned_at is None or i < thinned_at + more:
        yield i
        i += 1
        if thinned_at is None and engine.budget.every > 1:
            thinned_at = i
        assert i < 1_000_000, "the budget never thinned the sampling"


def _thinning_engine(tmp_path, name: str, **config):
    """A started Engine whose budget no step can meet: past its learning steps nearly every
    step takes the lean path."""
    run_dir = rundir.create(tmp_path, name)
    engine = Engine(run_dir, RunConfig(overhead_budget=0.001, **config))
    engine.start()
    return run_dir, engine


def _small_model():
    """A seeded 4-8-1 MLP and its SGD optimizer."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.05)


def test_a_thinned_step_of_two_micro_batches_stores_their_sum(tmp_path):
    # Gradient accumulation: on the lean path the first loss is read at its backward (given
    # here in a list, as torch.autograd.backward takes it too), the second is kept as a
    # tensor; the record adds them up as the script's own sum would.
    run_dir, engine = _thinning_engine(tmp_path, "micro")
    model, opt = _small_model()
    x, y = torch.randn(2, 16, 4), torch.randn(2, 16, 1)
    seen, read_early = [], 0
    try:
        for _ in _until_thinned(engine, 200):
            opt.zero_grad()
            halves = [torch.nn.functional.mse_loss(model(x[k]), y[k]) / 2 for k in range(2)]
            torch.autograd.backward([halves[0]])
            halves[1].backward()
            read_early += type(engine.hooks.state.losses[0]) is float
            opt.step()
            seen.append((halves[0].detach() + halves[1].detach()).item())
    finally:
        engine.finish("finished", 0)
    assert read_early > 100  # the lean path's early read was taken
    every_step = list(range(1, len(seen) + 1))
    with StoreReader(run_dir / "metrics.db") as store:
        assert store.series("loss") == (every_step, seen)
        assert store.series("loss/micro_batches") == (every_step, [2.0] * len(seen))


def test_a_batch_the_script_skips_after_its_backward_leaves_nothing_behind_when_thinned(tmp_path):
    # Scripts skip a bad batch: backward, then zero_grad and no step. Its loss, finite or
    # not, is not counted in the next step, and ptdash's NaN guard has nothing to stop.
    run_dir, engine = _thinning_engine(tmp_path, "skipped", on_anomaly="skip")
    model, opt = _small_model()
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    seen, skipped = [], 0
    try:
        for i in _until_thinned(engine, 200):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            if i % 10 == 5:
                (loss * float("nan") if i % 20 == 5 else loss).backward()
                opt.zero_grad()
                skipped += 1
                continue
            loss.backward()
            opt.step()
            seen.append(loss.detach().item())
    finally:
        engine.finish("finished", 0)
    assert skipped > 20 and all(torch.isfinite(p).all() for p in model.parameters())
    with StoreReader(run_dir / "metrics.db") as store:
        assert store.series("loss") == (list(range(1, len(seen) + 1)), seen)
        assert store.series("loss/micro_batches") == ([], [])
        assert [e for e in store.events() if e.kind == "anomaly"] == []


def test_a_profile_asked_while_steps_are_thinned_records_its_steps_and_ends(tmp_path):
    # The lean path calls the engine at step ends only while it has work there: an open
    # profile window must still see each of its steps end.
    from ptdash.shared.protocol import Command
    from support.runner import wait_for

    run_dir, engine = _thinning_engine(tmp_path, "profile")
    try:
        for _ in _until_thinned(engine, 5):
            _train(1)
        assert not engine.hooks.state.ends_wanted
        engine.controls.submit(Command(id="p", name="profile", value=3))
        at = engine.hooks.step
        _train(20)
        assert engine.profiler._current is None and not engine.hooks.state.ends_wanted
        wait_for(lambda: list((run_dir / "profiles").glob(f"profile-step{at + 1}-{at + 3}.json")), 60,
                 what="the profile's trace")
    finally:
        engine.finish("finished", 0)


def test_thinned_steps_fetch_batches_through_torchs_own_next_and_the_doctors_steps_still_time_them(tmp_path):
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    torchs = _BaseDataLoaderIter.__next__
    run_dir, engine = _thinning_engine(tmp_path, "loader")
    model, opt = _small_model()
    loader = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=4)
    assert _BaseDataLoaderIter.__next__ is not torchs
    step, epochs, thinned_at, torchs_own, watched_late = 0, 0, None, 0, None
    try:
        while watched_late is None or step < watched_late + 5:
            epochs += 1
            for x, y in loader:
                opt.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                opt.step()
                step += 1
                torchs_own += _BaseDataLoaderIter.__next__ is torchs
                if thinned_at is None and engine.budget.every > 1:
                    thinned_at = step
                if thinned_at is not None and watched_late is None and engine.doctor.watching:
                    watched_late = step + 1  # the doctor watches the next step
                assert step < 1_000_000, "the budget never thinned, or the doctor never watched again"
        assert engine.hooks.loaders.epoch() == epochs
    finally:
        engine.finish("finished", 0)
    assert _BaseDataLoaderIter.__next__ is torchs  # detached: torch's own again
    assert torchs_own > 100
    with StoreReader(run_dir / "metrics.db") as store:
        timed = dict(zip(*store.series("time/data_s")))
    assert set(range(2, 30)) <= set(timed)  # the doctor's first steps: every batch timed
    assert timed[watched_late] > 0  # its batch came through ptdash's __next__ again


# After a lean step the next lean steps run without the optimizer pre-step hook (hooks.py);
# what it would have done is done where it can change. These scripts change it mid-run.


def _until_skipping(engine, more: int):
    """0, 1, 2, ...: until lean steps run without the pre-step hook, then ``more`` more."""
    for i in _until_thinned(engine, 10_000_000):
        if engine.hooks.state.pre_off:
            break
        assert i < 100_000, "the pre-step hook never went off"
        yield i
    yield from range(i, i + more)


def test_a_clip_sent_while_the_pre_step_hook_is_off_clips_the_update_of_the_step_it_names(tmp_path):
    from ptdash.shared.protocol import Command

    run_dir, engine = _thinning_engine(tmp_path, "clip-off")
    model, opt = _small_model()
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    moved, sent_at = {}, None
    try:
        for i in _until_skipping(engine, 12):
            if sent_at is None and engine.hooks.state.pre_off:
                engine.controls.submit(Command(id="c", name="clip", value=1e-3))
                sent_at = engine.hooks.step
            before = [p.detach().clone() for p in model.parameters()]
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            moved[engine.hooks.step] = torch.cat([(p - b).reshape(-1) for p, b in zip(model.parameters(), before)])
    finally:
        engine.finish("finished", 0)
    with StoreReader(run_dir / "metrics.db") as store:
        (ack,) = [e for e in store.events() if e.kind == "command"]
        first = ack.data["applied_step"] + 1  # applied after that many steps: "from step <first>"
        steps, maxes = store.series("grad/clip_max")
        norms = dict(zip(*store.series("grad/norm_total")))
    assert f"from step {first}" in ack.message
    assert sent_at + 1 <= first <= sent_at + 2  # the next boundary it reached: a step later at most
    assert steps == list(range(first, steps[-1] + 1)) and set(maxes) == {1e-3}
    # SGD without momentum moves by lr x the clipped gradient: clipped from the step named on.
    assert norms[first] > 0.01
    assert moved[first].norm().item() == pytest.approx(0.05 * 1e-3, rel=1e-3)
    assert moved[first - 1].norm().item() > 0.05 * 0.01


def test_an_optimizer_made_while_the_pre_step_hook_is_off_has_every_step_recorded(tmp_path):
    run_dir, engine = _thinning_engine(tmp_path, "new-opt")
    model, opt = _small_model()
    head = torch.nn.Linear(4, 1)
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    other, first = [], None
    try:
        for i in _until_skipping(engine, 100):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            if first is None and engine.hooks.state.pre_off:
                head_opt, first = torch.optim.SGD(head.parameters(), lr=0.01), engine.hooks.step
            if first is not None:
                head_opt.zero_grad()
                loss = torch.nn.functional.mse_loss(head(x), y)
                loss.backward()
                head_opt.step()
                other.append(loss.item())
    finally:
        engine.finish("finished", 0)
    with StoreReader(run_dir / "metrics.db") as store:
        assert store.series("opt1/loss") == (list(range(first, first + len(other))), other)


def _plain_step(opt, model, x, y) -> float:
    """One step on an MSE loss; its loss."""
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    return loss.item()


def _closure_step(opt, model, x, y) -> list[float]:
    """``opt.step(closure)`` on an MSE loss; the loss of each evaluation, in order."""
    evaluated = []

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        evaluated.append(loss.item())
        return loss

    opt.step(closure)
    return evaluated


def test_an_lbfgs_that_takes_over_after_lean_steps_records_each_steps_first_evaluation(tmp_path):
    # The physics-informed networks' recipe: a first optimizer, then LBFGS with a closure,
    # evaluated several times a step; the first optimizer is let go.
    run_dir, engine = _thinning_engine(tmp_path, "lbfgs-late")
    model, opt = _small_model()
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    seen, lbfgs_steps, evaluations = [], 0, 0
    try:
        for i in _until_skipping(engine, 30):
            if not engine.hooks.state.pre_off and not lbfgs_steps:
                seen.append(_plain_step(opt, model, x, y))
                continue
            if not lbfgs_steps:
                opt = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=4)  # the first one is gone
            evaluated = _closure_step(opt, model, x, y)
            seen.append(evaluated[0])
            lbfgs_steps += 1
            evaluations += len(evaluated)
    finally:
        engine.finish("finished", 0)
    assert lbfgs_steps == 30 and evaluations > 40
    with StoreReader(run_dir / "metrics.db") as store:
        assert store.series("loss") == (list(range(1, len(seen) + 1)), seen)


def test_a_clip_that_starts_after_lean_steps_is_seen_from_its_first_step(tmp_path):
    run_dir, engine = _thinning_engine(tmp_path, "late-clip-only")
    model, opt = _small_model()
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    norms, first = [], None
    try:
        for i in _until_skipping(engine, 30):
            if first is None and engine.hooks.state.pre_off:
                first = engine.hooks.step + 1
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            if first is not None:
                norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0).item())
            opt.step()
    finally:
        engine.finish("finished", 0)
    with StoreReader(run_dir / "metrics.db") as store:
        steps, values = store.series("grad/norm_total")
    late = [(s, v) for s, v in zip(steps, values) if s >= first]
    assert late == list(zip(range(first, first + len(norms)), norms))


def test_a_clip_and_a_scaler_that_start_after_lean_steps_are_seen_from_their_first_step(tmp_path):
    run_dir, engine = _thinning_engine(tmp_path, "late-clip")
    model, opt = _small_model()
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    seen, norms, first = [], [], None
    try:
        for i in _until_skipping(engine, 60):
            if first is None and engine.hooks.state.pre_off:
                first = engine.hooks.step + 1
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            if first is None:
                loss.backward()
                opt.step()
            else:
                scaler.scale(loss).backward()
                scaler.unscale_(opt)
                norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0).item())
                scaler.step(opt)
                scaler.update()
            seen.append(loss.item())
    finally:
        engine.finish("finished", 0)
    with StoreReader(run_dir / "metrics.db") as store:
        assert store.series("loss") == (list(range(1, len(seen) + 1)), seen)  # unscaled, every step
        steps, values = store.series("grad/norm_total")
    late = [(s, v) for s, v in zip(steps, values) if s >= first]
    assert late == list(zip(range(first, first + len(norms)), norms))  # the script's clip: every step


@pytest.mark.parametrize("which", ["first", "second"])
def test_a_nan_micro_batch_while_the_pre_step_hook_is_off_is_caught_before_the_update(tmp_path, which):
    # One batch a step until the pre-step hook is off, then two micro-batches a step (after
    # micro-batches the hook stays on), the first step of them with a NaN in one.
    run_dir, engine = _thinning_engine(tmp_path, "micro-nan", on_anomaly="skip")
    model, opt = _small_model()
    x, y = torch.randn(2, 16, 4), torch.randn(2, 16, 1)
    planted = None
    try:
        for i in _until_skipping(engine, 20):
            opt.zero_grad()
            halves = [torch.nn.functional.mse_loss(model(x[k]), y[k]) / 2 for k in range(2)]
            if planted is None and not engine.hooks.state.pre_off:
                (halves[0] + halves[1]).backward()  # the same loss, in one backward
                opt.step()
                continue
            if planted is None:
                assert engine.hooks.state.lean  # the step is lean, without its pre-step hook
                k = 0 if which == "first" else 1
                halves[k], planted = halves[k] * float("nan"), engine.hooks.step + 1
                before = [p.detach().clone() for p in model.parameters()]
            for half in halves:
                half.backward()
            opt.step()
            if planted == engine.hooks.step:
                assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # skipped
    finally:
        engine.finish("finished", 0)
    assert planted is not None and all(torch.isfinite(p).all() for p in model.parameters())
    with StoreReader(run_dir / "metrics.db") as store:
        anomalies = [e for e in store.events() if e.kind == "anomaly"]
    assert [(e.data["step"], "update skipped" in e.message) for e in anomalies] == [(planted, True)], \
        [e.message for e in anomalies]


@pytest.mark.parametrize("thinned", [False, True])
def test_an_optimizer_that_takes_over_while_the_first_is_still_referenced_becomes_the_main_one(tmp_path, thinned):
    # Physics-informed networks: a first optimizer (Adam, here SGD), then LBFGS with a closure,
    # both kept in variables. From its HANDOVER_STEPS-th step in a row the steps are LBFGS's.
    run_dir = rundir.create(tmp_path, "handover")
    engine = Engine(run_dir, RunConfig(overhead_budget=0.001 if thinned else 1.0))
    engine.start()
    model, sgd = _small_model()
    lbfgs = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=3)
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    first_steps = 300 if thinned else 20
    seen = []
    try:
        for i in range(first_steps + 30):
            if i < first_steps:
                seen.append(_plain_step(sgd, model, x, y))
                continue
            seen.append(_closure_step(lbfgs, model, x, y)[0])
        assert engine.hooks.step == len(seen) - (HANDOVER_STEPS - 1)
        assert engine.hooks.main.ref() is lbfgs
    finally:
        engine.finish("finished", 0)
    with StoreReader(run_dir / "metrics.db") as store:
        # The first LBFGS steps before the handover are kept at the step they followed (the
        # newest of them), as opt1; the main steps go on from the next.
        kept_as_other = seen[first_steps:first_steps + HANDOVER_STEPS - 1]
        del seen[first_steps:first_steps + HANDOVER_STEPS - 1]
        assert store.series("loss") == (list(range(1, len(seen) + 1)), seen)
        assert store.series("opt1/loss") == ([first_steps], kept_as_other[-1:])
        assert store.series("opt/lr/group0")[1][-1] == 0.1
        (event,) = [e for e in store.events() if "main optimizer" in e.message]
    assert f"LBFGS is the main optimizer from step {first_steps + 1}" in event.message and "SGD" in event.message


def test_the_second_optimizer_of_thinned_steps_becomes_the_main_one_when_the_first_stops(tmp_path):
    # Two optimizers a step (lean, thinned), then only the second (a phase that trains the head alone).
    run_dir, engine = _thinning_engine(tmp_path, "second-alone")
    model, body_opt = _small_model()
    head = torch.nn.Linear(1, 1)
    head_opt = torch.optim.SGD(head.parameters(), lr=0.01)
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    both, alone, head_losses, off_at = 0, 0, [], None
    try:
        for i in _until_skipping(engine, 200):
            if off_at is None and engine.hooks.state.pre_off:
                off_at = i
            if off_at is None or i < off_at + 100:  # the head alone for the last 100
                body_opt.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                body_opt.step()
                both += 1
            else:
                alone += 1
            head_opt.zero_grad()
            loss = torch.nn.functional.mse_loss(head(model(x).detach()), y)
            loss.backward()
            head_opt.step()
            head_losses.append(loss.item())
        assert engine.hooks.main.ref() is head_opt and alone == 100
    finally:
        engine.finish("finished", 0)
    with StoreReader(run_dir / "metrics.db") as store:
        steps, losses = store.series("loss")
        (event,) = [e for e in store.events() if "main optimizer" in e.message]
    # The head's steps alone are the run's steps from the HANDOVER_STEPS-th of them.
    assert steps == list(range(1, both + alone - HANDOVER_STEPS + 2))
    assert losses[both:] == head_losses[both + HANDOVER_STEPS - 1:]
    assert f"from step {both + 1}" in event.message


def test_a_discriminator_whose_steps_are_skipped_a_few_times_stays_the_main_one(tmp_path):
    # GradScaler skips a step whose gradients overflowed: the discriminator's step is not
    # called for a few iterations while the generator's is. Nothing is handed over.
    run_dir, engine = _thinning_engine(tmp_path, "d-skips")
    disc, opt_d = _small_model()
    gen = torch.nn.Linear(4, 4)
    opt_g = torch.optim.SGD(gen.parameters(), lr=0.01)
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    d_steps = 0
    try:
        for i in range(400):
            # Skipped for HANDOVER_STEPS - 2 iterations in 50: with the generator's step after
            # the discriminator's last, HANDOVER_STEPS - 1 of the generator's in a row.
            if not 10 <= i % 50 < 10 + HANDOVER_STEPS - 2:
                d_steps += 1
                _plain_step(opt_d, disc, x, y)
            opt_g.zero_grad()
            torch.nn.functional.mse_loss(disc(gen(x)), y).backward()
            opt_g.step()
        assert engine.hooks.main.ref() is opt_d and engine.hooks.step == d_steps
    finally:
        engine.finish("finished", 0)
    with StoreReader(run_dir / "metrics.db") as store:
        assert not [e for e in store.events() if "main optimizer" in e.message]


def test_an_actor_critic_that_clips_both_then_steps_three_optimizers_keeps_both_totals_when_thinned(tmp_path):
    # SAC's shape: one backward, the critic's and the actor's clips, then three steps. Each
    # clip computes its total every step, so each is stored every step at any sampling rate.
    run_dir, engine = _thinning_engine(tmp_path, "sac")
    torch.manual_seed(0)
    critic = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    actor = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    log_alpha = torch.zeros(1, requires_grad=True)
    opts = [torch.optim.Adam(critic.parameters(), 1e-3), torch.optim.Adam(actor.parameters(), 1e-3),
            torch.optim.Adam([log_alpha], 1e-3)]
    totals: list[list[float]] = [[], []]
    try:
        for _ in _until_thinned(engine, 300):
            s = torch.randn(32, 4)
            a = actor(s)
            q_loss = (critic(torch.cat([s, torch.randn(32, 2)], 1)) - 1).pow(2).mean()
            pi_loss = -critic(torch.cat([s, a], 1)).mean() + log_alpha.exp().detach() * a.pow(2).mean()
            alpha_loss = -(log_alpha * (a.detach().pow(2).mean() - 1))
            for opt in opts:
                opt.zero_grad()
            (q_loss + pi_loss + alpha_loss).backward()
            for i, model in enumerate((critic, actor)):
                totals[i].append(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).item())
            for opt in opts:
                opt.step()
    finally:
        engine.finish("finished", 0)
    every_step = list(range(1, len(totals[0]) + 1))
    with StoreReader(run_dir / "metrics.db") as store:
        assert store.series("grad/norm_total") == (every_step, pytest.approx(totals[0]))
        assert store.series("opt1/grad/norm_total") == (every_step, pytest.approx(totals[1]))
        assert len(store.series("opt2/grad/norm_total")[0]) < len(every_step) / 2  # unclipped: sampled


def test_records_a_flush_cannot_read_are_one_warning_event_and_nothing_in_the_scripts_output(tmp_path, capfd):
    # Each flush that drops records logs it in engine.log; the run's events say it once, and
    # the script's stderr (its output.log under ptdash) never sees it.
    from ptdash.enginelog import setup_logging
    from ptdash.recorder import StepRecord

    run_dir = rundir.create(tmp_path, "dropped")
    logger = logging.getLogger("ptdash")
    handlers, propagate = list(logger.handlers), logger.propagate
    setup_logging(run_dir)
    engine = Engine(run_dir, RunConfig())
    engine.start()
    try:
        for _ in range(2):
            _train(3)
            engine.recorder.add(tuple.__new__(StepRecord, (*range(16),)))  # a field too many
            assert engine.flusher.flush_now(timeout=60)
    finally:
        engine.finish("finished", 0)
        for handler in logger.handlers[len(handlers):]:  # this process's logging as it was
            logger.removeHandler(handler)
            handler.close()
        logger.propagate = propagate
    with StoreReader(run_dir / "metrics.db") as store:
        assert store.series("loss")[0] == list(range(1, 7))  # every readable step kept
        said = [e for e in store.events() if "could not read" in e.message]
    assert len(said) == 1 and said[0].kind == "warning"
    assert (run_dir / "engine.log").read_text().count("could not read") == 2
    assert "could not read" not in capfd.readouterr().err


@pytest.mark.parametrize("shape", ["one-backward", "in-turn", "unclipped-first"])
def test_sac_shapes_keep_every_clipped_total_at_the_sparsest_sampling(tmp_path, shape):
    # Issue 34 (SAC with three optimizers): once per-layer norms are sampled one step in
    # K_MAX, each clip's total must still be stored at every step, for whichever optimizer.
    from ptdash.budget import K_MAX

    run_dir, engine = _thinning_engine(tmp_path, f"sac-{shape}")
    engine.budget.decide = lambda: None  # held at K_MAX from step 70 (below: set as the flusher would)
    torch.manual_seed(0)
    critic = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    actor = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    log_alpha = torch.zeros(1, requires_grad=True)
    q_opt, pi_opt, a_opt = (torch.optim.Adam(critic.parameters(), 1e-3), torch.optim.Adam(actor.parameters(), 1e-3),
                            torch.optim.Adam([log_alpha], 1e-3))
    clip = torch.nn.utils.clip_grad_norm_
    steps = 600
    try:
        for i in range(steps):
            if i == 70:
                engine.budget.every = K_MAX
                for listener in engine.budget.on_change:
                    listener()
            s = torch.randn(32, 4)
            if shape == "one-backward":
                a = actor(s)
                q = (critic(torch.cat([s, torch.randn(32, 2)], 1)) - 1).pow(2).mean()
                pi = -critic(torch.cat([s, a], 1)).mean() + log_alpha.exp().detach() * a.pow(2).mean()
                for opt in (q_opt, pi_opt, a_opt):
                    opt.zero_grad()
                (q + pi - log_alpha * (a.detach().pow(2).mean() - 1)).backward()
                clip(critic.parameters(), 1.0)
                clip(actor.parameters(), 1.0)
                for opt in (q_opt, pi_opt, a_opt):
                    opt.step()
                continue
            if shape == "unclipped-first":  # the temperature's optimizer steps first: the main one
                a_opt.zero_grad()
                (-(log_alpha * (actor(s).detach().pow(2).mean() - 1))).backward()
                a_opt.step()
            q_opt.zero_grad()
            (critic(torch.cat([s, torch.randn(32, 2)], 1)) - 1).pow(2).mean().backward()
            clip(critic.parameters(), 1.0)
            q_opt.step()
            a = actor(s)
            pi_opt.zero_grad()
            (-critic(torch.cat([s, a], 1)).mean() + log_alpha.exp().detach() * a.pow(2).mean()).backward()
            clip(actor.parameters(), 1.0)
            pi_opt.step()
            if shape == "in-turn":
                a_opt.zero_grad()
                (-(log_alpha * (a.detach().pow(2).mean() - 1))).backward()
                a_opt.step()
    finally:
        engine.finish("finished", 0)
    clipped = {"one-backward": ("grad/norm_total", "opt1/grad/norm_total"),
               "in-turn": ("grad/norm_total", "opt1/grad/norm_total"),
               "unclipped-first": ("opt1/grad/norm_total", "opt2/grad/norm_total")}[shape]
    every_step = list(range(1, steps + 1))
    with StoreReader(run_dir / "metrics.db") as store:
        for name in clipped:
            assert store.series(name)[0] == every_step, name
