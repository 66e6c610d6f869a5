"""The judge's spike rule (engine/spikes.py): robust, not a ratio."""

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


def _climb() -> list[float]:
    """A gradient norm as cuda_sync_free.py's model starts to fit (measured): flat and falling,
    then 1.25x a step for ten steps (0.106 to 0.938), then back down."""
    rng = random.Random(1)
    flat = [0.2 - 0.0015 * i + 0.004 * rng.random() for i in range(60)]
    return flat + [0.106 * 1.25 ** i for i in range(11)] + [0.746, 0.425, 0.743, 1.187, 1.091, 0.768, 0.459]


def _flush_judged(series, jump: bool) -> list[int]:
    """Judged as the flusher judges a GPU run's rows: in one flush, by the values before them."""
    window, found = Window(), []
    for i, value in enumerate(series):
        if window.over(value, window.newest if jump else None):
            found.append(i)
        else:
            window.add(value)
    return found


def test_a_gradient_norm_that_climbs_is_no_spike_one_that_jumps_is():
    series = _climb()
    assert _flush_judged(series, jump=False) != []  # by the limit alone, the climb trips (it did on an H200)
    assert _flush_judged(series, jump=True) == []
    wild = list(series)
    wild[66] = wild[65] * 100  # a bad batch in the middle of the climb
    assert _flush_judged(wild, jump=True) == [66]
    assert _flush_judged(series[:45] + [1e3] + series[45:], jump=True) == [45]


def test_the_training_thread_judges_a_cpu_norm_by_the_one_before_it():
    """The one judge on CPU (prestep.py calls it before each update with the step's norm)
    while the flusher fills the windows ten rows at a time, a flush behind."""
    from ptdash.judge import Judge

    def judged(series) -> list[int]:
        judge = Judge(limit_to=lambda limit: None)
        found = []
        for i, norm in enumerate(series):
            if i % 10 == 0:
                judge.observe([(s, 0.0, {"loss": 1.0, "grad/norm_total": series[s]})
                               for s in range(max(0, i - 20), max(0, i - 10))])
            if judge.at_step(i, [1.0], norm) is not None:
                found.append(i)
        return found

    assert judged(_climb()) == []
    wild = _climb()
    wild[66] = wild[65] * 100
    assert judged(wild) == [66]
