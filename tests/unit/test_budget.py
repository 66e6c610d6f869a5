"""The cost budget's decisions (engine/budget.py), from measured costs given here."""

from __future__ import annotations

import pytest

from ptdash.budget import K_MAX, LEARN_STEPS, STEP_WINDOW, Budget, choose_every
from ptdash.recorder import StepRecord

US = 1e-6


def test_the_period_is_the_smallest_power_of_two_within_the_budget():
    # 10 us every step, 100 us more on a sampled one; 1% of a 2 ms step is 20 us: 10 + 100/k <= 20.
    assert choose_every(2e-3, 10 * US, 100 * US, 0.01, 1) == 16
    # A 20 ms step affords sampling every step (110 us <= 0.8 * 200 us).
    assert choose_every(20e-3, 10 * US, 100 * US, 0.01, 16) == 1
    # A floor above the budget: the sparsest sampling, and no further.
    assert choose_every(1e-3, 50 * US, 100 * US, 0.01, 1) == K_MAX


def test_the_period_does_not_flap_near_the_budget():
    # 2.5 ms: 8 would fit (22.5 <= 25 us) but not under 0.8 of the budget (20 us): stay at 16.
    assert choose_every(2.5e-3, 10 * US, 100 * US, 0.01, 16) == 16
    # From 1 it goes straight to the first period that fits.
    assert choose_every(2.5e-3, 10 * US, 100 * US, 0.01, 1) == 8
    # Denser only down to what fits under 0.8 of the budget: 16 at 2.5 ms from 64.
    assert choose_every(2.5e-3, 10 * US, 100 * US, 0.01, 64) == 16


def _records(first: int, n: int, step_s: float, own: float, extra: float, every: int) -> list[StepRecord]:
    out, t = [], 100.0
    for step in range(first, first + n):
        sampled = step % every == 0
        out.append(StepRecord(step, 0.0, [], None, [0.0] if sampled else None, None, None, [0.1],
                              (t, None, None, t + step_s, None, 0.0), 0, None, None, 0,
                              own + (extra if sampled else 0.0), extra if sampled else 0.0))
        t += step_s
    return out


def test_the_budget_thins_when_steps_become_fast_and_samples_again_when_they_slow():
    budget = Budget(1.0)
    # Slow steps (20 ms): every step sampled, whatever the count.
    budget.observe(_records(1, 200, 20e-3, 10 * US, 100 * US, budget.every))
    assert budget.decide() is None and budget.every == 1
    # Fast steps (2 ms): one in 16, said in one sentence.
    budget.observe(_records(201, STEP_WINDOW, 2e-3, 10 * US, 100 * US, budget.every))
    change = budget.decide()
    assert budget.every == 16 and budget.doctor_every == 256
    assert change.startswith("sampling: per-layer gradient norms one step in 16 from step 265") and "budget 1%" in change
    # The same again: no change, no sentence.
    budget.observe(_records(265, STEP_WINDOW, 2e-3, 10 * US, 100 * US, budget.every))
    assert budget.decide() is None
    # Slow again: back to every step once the window's median step is slow.
    budget.observe(_records(329, STEP_WINDOW // 2 + 1, 20e-3, 10 * US, 100 * US, budget.every))
    assert "every step" in budget.decide() and budget.every == 1


def test_nothing_is_thinned_before_the_first_steps_of_the_process():
    budget = Budget(1.0)
    # The process's first step (its start-up) and then LEARN_STEPS - 1 steps: still learning.
    budget.observe(_records(1000, LEARN_STEPS, 1e-3, 50 * US, 100 * US, 1))
    assert budget.decide() is None and budget.every == 1
    budget.observe(_records(1000 + LEARN_STEPS, 1, 1e-3, 50 * US, 100 * US, 1))
    assert budget.decide() is not None and budget.every == K_MAX


def test_the_start_up_of_the_first_step_is_not_read_as_a_cost():
    # A short run's figure was the first step's tens of milliseconds of discovery, spread
    # over a few steps ("12% of step time" on a 32-step run).
    budget = Budget(1.0)
    first = _records(1, 1, 2e-3, 60_000 * US, 0.0, 1)
    budget.observe(first + _records(2, 30, 2e-3, 10 * US, 0.0, 1))
    assert budget.reading()["ptdash/step_pct"] == pytest.approx(0.5)
    budget.observe(_records(32, 10, 2e-3, 60_000 * US, 0.0, 1))  # a slow later step counts
    assert budget.reading()["ptdash/step_pct"] > 100


def test_a_larger_budget_affords_more():
    fast = _records(1, 100, 2e-3, 10 * US, 100 * US, 1)
    small, large = Budget(1.0), Budget(10.0)
    for budget in (small, large):
        budget.observe(fast)
        budget.decide()
    assert (small.every, large.every) == (16, 1)


def test_the_reading_is_ptdash_share_of_the_step_time():
    budget = Budget(2.0)
    budget.observe(_records(1, 11, 2e-3, 10 * US, 0.0, 1))  # the first: start-up, left out
    reading = budget.reading()
    assert reading["ptdash/step_pct"] == pytest.approx(0.5)
    assert reading["ptdash/layers_every"] == 1 and reading["ptdash/budget_pct"] == 2.0
    assert reading["ptdash/threads_pct"] is not None
    assert budget.reading()["ptdash/step_pct"] is None  # no step since


def test_the_dashboard_knows_the_sparsest_sampling():
    from ptdash.tui.tabs.system import K_MAX as SHOWN

    assert SHOWN == K_MAX


def test_the_floor_keeps_a_sampled_step_every_quarter_of_the_run_and_every_few_seconds():
    from ptdash.budget import FLOOR_S, floor_every

    assert floor_every(72, 1e-3) == 16 and floor_every(150, 1e-3) == 32 and floor_every(4096, 1e-3) == K_MAX
    assert floor_every(100_000, 0.1) == 32  # 5 s of 100 ms steps: 50 steps, a power of two within them
    assert floor_every(100_000, 2 * FLOOR_S) == 1 and floor_every(3, 1e-3) == 1
    # A 150-step run whose steps cannot afford the norm pass: held at the floor, said so, then let go.
    budget = Budget(1.0)
    budget.observe(_records(1, 72, 1e-3, 50 * US, 100 * US, 1))
    change = budget.decide()
    assert budget.every == 16 and "the budget alone would sample one step in 256" in change, change
    budget.observe(_records(73, 80, 1e-3, 50 * US, 100 * US, budget.every))
    budget.decide()
    assert budget.every == 32  # step 152: a quarter of it is 38
    budget.observe(_records(153, 2000, 1e-3, 50 * US, 100 * US, budget.every))
    assert "would sample" not in budget.decide() and budget.every == K_MAX


def test_what_was_kept_is_counted():
    budget = Budget(1.0)
    records = _records(1, 40, 2e-3, 10 * US, 100 * US, 4)  # a total norm on every 4th step
    records = [r._replace(total=0.5) if r.layers is not None else r for r in records]
    budget.observe(records + [records[0]._replace(opt=1)])  # another optimizer's record is no step of its own
    budget.kept(layers=3, ratios=1)
    reading = budget.reading()
    assert (reading["ptdash/kept_steps"], reading["ptdash/kept_norm_steps"]) == (40, 10)
    assert (reading["ptdash/kept_layer_steps"], reading["ptdash/kept_ratio_steps"]) == (3, 1)
