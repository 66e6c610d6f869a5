"""The one anomaly judge (engine/judge.py): where it decides, what it learns from, what it says."""

from __future__ import annotations

import math
import random

from ptdash.judge import Judge


def _rows(first: int, last: int, loss=lambda s: 1.0 + 0.01 * (s % 7), norm=lambda s: 2.0 + 0.01 * (s % 5)):
    return [[s, 0.0, {"loss": loss(s), "grad/norm_total": norm(s)}] for s in range(first, last + 1)]


def test_cpu_steps_before_the_first_limit_are_judged_at_the_flush_and_after_it_at_the_step():
    now = [90]
    limits = []
    judge = Judge(limit_to=limits.append, step_now=lambda: now[0])
    assert judge.at_step(1, [1.0], 2.0) is None  # no limit yet: nothing is judged a spike
    rows = _rows(1, 90)
    rows[59][2]["loss"] = 5e8  # step 60, before any limit existed on the training thread
    (late,) = judge.observe(rows)
    assert late.step == 60 and late.what == "loss spike" and not late.before_update
    assert limits[-1] < 3 and limits[-1] == judge.loss.limit
    found = judge.at_step(95, [4e8], None)
    assert found.step == 95 and found.before_update and found.value == 4e8
    # Step 95 was found at its step: the flush neither says it again nor learns from it.
    assert judge.observe([[95, 0.0, {"loss": 4e8}]]) == [] and max(judge.loss.values) < 2


def test_a_gpu_run_is_judged_at_the_flush_one_incident_once():
    judge = Judge(limit_to=lambda limit: None)
    rows = _rows(1, 200)
    rows[100][2]["loss"] = 7e7  # step 101: the wild batch; its update ruins the next steps
    for r in rows[101:110]:
        r[2]["loss"] = None
    found = judge.observe(rows[:150]) + judge.observe(rows[150:])
    assert [(f.step, f.what) for f in found] == [(101, "loss spike")]
    assert found[0].text().startswith("loss spike at step 101 (7e+07, over the limit ")


def test_a_non_finite_row_of_a_gpu_run_is_one_finding_until_the_run_is_healthy_again():
    judge = Judge(limit_to=lambda limit: None)
    rows = _rows(1, 60)
    for s in (20, 21, 22, 50):
        rows[s - 1][2]["grad/norm_total"] = None
    assert [f.step for f in judge.observe(rows)] == [20, 50]
    assert judge.nonfinite(5, before_update=False).text() == "non-finite loss or gradient at step 5"


def test_rolled_back_steps_are_not_learned_from():
    judge = Judge(limit_to=lambda limit: None)
    judge.observe(_rows(1, 100))
    judge.exclude(101)
    judge.close(101, 110)
    judge.observe(_rows(101, 110, loss=lambda s: 1e3))
    assert max(judge.loss.values) < 2 and judge.left_out(105) and not judge.left_out(111)


def test_a_rank_that_does_not_judge_spikes_still_leaves_non_finite_values_to_its_caller():
    judge = Judge(limit_to=lambda limit: None, spikes=False)
    judge.observe(_rows(1, 100))
    assert judge.at_step(101, [1e9], 1e9) is None
    assert judge.observe([[102, 0.0, {"loss": 1e9}]]) == []


def test_reinforcement_learning_losses_and_a_warm_up_raise_nothing():
    for seed in range(10):
        rng = random.Random(seed)
        judge = Judge(limit_to=lambda limit: None)
        # A warm-up's fall, then a critic's loss: heavy-tailed, drifting up as returns grow.
        series = [20.0 * math.exp(-i / 50) + 0.1 * rng.random() for i in range(300)]
        series += [abs(rng.gauss(1.0 + i / 400, 1.0)) * (3 if rng.random() < 0.02 else 1) for i in range(3000)]
        found = []
        for start in range(0, len(series), 50):
            rows = [[s + 1, 0.0, {"loss": series[s]}] for s in range(start, min(start + 50, len(series)))]
            found += judge.observe(rows)
        assert found == [], (seed, [(f.step, f.value, f.limit) for f in found])


def test_a_loss_that_rises_with_an_lr_jump_is_a_new_regime_not_a_spike():
    limits = []
    judge = Judge(limit_to=limits.append, step_now=lambda: 100)
    lr = {"opt/lr/group0": 0.01}
    judge.observe([[s, 0.0, {"loss": 1.0 + 0.001 * (s % 3), **lr}] for s in range(1, 101)])
    assert judge.at_step(101, [5.0], None, lr=0.01) is not None  # 5x a flat loss at the same LR: a spike
    assert judge.at_step(102, [5.0], None, lr=0.1) is None  # the LR went up 10x: a new regime
    assert limits[-1] == math.inf and judge.loss.values == type(judge.loss.values)()
    # The rows of the old regime still in the recorder are not learned from; the new ones are.
    judge.observe([[s, 0.0, {"loss": 1.0, "opt/lr/group0": 0.01}] for s in range(101, 102)]
                  + [[s, 0.0, {"loss": 5.0 + 0.01 * (s % 3), "opt/lr/group0": 0.1}] for s in range(102, 150)])
    assert min(judge.loss.values) >= 5.0 and judge.loss.limit > 5.0
    # A GPU's rows: the jump is seen in the rows themselves.
    gpu = Judge(limit_to=lambda limit: None)
    rows = [[s, 0.0, {"loss": 1.0 + 0.001 * (s % 3), "opt/lr/group0": 0.01 if s <= 100 else 0.1}]
            for s in range(1, 201)]
    for r in rows[100:]:
        r[2]["loss"] *= 5
    assert gpu.observe(rows) == []
