"""Series buffers (decimation, merging) and the step rate, on plain lists."""

import pytest

from ptdash.tui.series import Series, StepRate


def test_series_decimates_after_the_fact_and_ignores_old_rows():
    series = Series(cap=100)
    series.extend(list(range(150)), [float(i) for i in range(150)])
    assert len(series) <= 100
    assert series.steps[0] == 0 and series.last_step == 149
    version = series.version
    series.extend([3, 4], [0.0, 0.0])  # older than the last step: ignored
    assert series.last_step == 149
    series.append(150, None)
    assert series.latest() is None and series.version > version


def test_series_merge_fills_gaps_in_order():
    series = Series()
    series.extend([1, 2, 6], [1.0, 2.0, 6.0])
    series.merge([3, 4, 5, 6], [3.0, 4.0, 5.0, 99.0])
    assert series.steps == [1, 2, 3, 4, 5, 6]
    assert series.values[-1] == 6.0  # existing steps win


def test_step_rate_uses_recent_walls():
    rate = StepRate(window_s=10)
    assert rate.rate() is None
    for s in range(100):
        rate.add(s, 1000.0 + s * 0.5)  # 2 steps/s
    assert rate.rate() == pytest.approx(2.0)
    rate.add(100, 1000.0 + 99 * 0.5 + 10)  # a slow step
    assert rate.rate() < 2.0


def test_step_rate_leaves_out_paused_time():
    rate = StepRate(window_s=1000)
    for s in range(1, 11):
        rate.add(s, 1000.0 + s)  # 1 step/s
    rate.pause(1010.5)
    rate.resume(1310.5)  # five minutes standing still
    for s in range(11, 21):
        rate.add(s, 1300.0 + s)
    assert rate.rate() == pytest.approx(1.0)
    rate.pause(1321.0)  # paused now: the open pause counts up to the newest step only
    assert rate.rate() == pytest.approx(1.0)
