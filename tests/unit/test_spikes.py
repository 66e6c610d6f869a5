"""The rollback's spike judge (engine/spikes.py): robust, not a ratio."""

import math
import random

from ptdash.spikes import WARMUP, Window, limit


def _trips(series) -> list[int]:
    """Steps judged spikes when each value is judged against the good ones before it."""
    window, found = Window(), []
    for i, value in enumerate(series):
        window.update()
        if window.over(value):
            found.append(i)
        else:
            window.add(value)
    return found


def test_a_wild_batch_trips_and_a_warm_up_does_not():
    rng = random.Random(0)
    warmup = [10.0 * math.exp(-i / 30) + 0.05 * rng.random() for i in range(300)]
    assert _trips(warmup) == []
    wild = list(warmup)
    wild[200] = 6.7e5
    assert _trips(wild) == [200]


def test_a_noisy_reinforcement_learning_loss_does_not_trip_where_a_3x_ratio_does():
    for seed in range(10):
        rng = random.Random(seed)
        # An RL-like loss: its noise as large as its level, which drifts; 3% of batches doubled.
        series = [abs(rng.gauss(1.0 + i / 500, 1.0)) * (2 if rng.random() < 0.03 else 1) for i in range(2000)]
        assert _trips(series) == [], seed
        ema, ratio_trips = None, 0
        for value in series:
            if ema is not None and value > 3 * ema:
                ratio_trips += 1
            ema = value if ema is None else 0.95 * ema + 0.05 * value
        assert ratio_trips >= 2, seed


def test_nothing_is_judged_before_the_warm_up_and_a_flat_loss_keeps_a_floor():
    assert limit([1.0] * (WARMUP - 1)) == math.inf
    flat = [1.0] * WARMUP
    assert 1.5 < limit(flat) < 2.0  # the spread is at least a tenth of the median
    assert _trips([1.0] * 100 + [1.2, 0.9, 1.3]) == []
    assert _trips([-5.0 + 0.01 * (i % 3) for i in range(100)] + [40.0]) == [100]


def test_the_rows_of_one_flush_are_judged_by_the_values_before_them():
    window = Window()
    rows = [1.0 + 0.01 * (i % 5) for i in range(100)] + [1e5]
    judged = []
    for value in rows:  # one flush: no update() between the rows but what add() does
        judged.append(window.over(value))
        if not judged[-1]:
            window.add(value)
    assert judged.index(True) == 100 and judged.count(True) == 1
