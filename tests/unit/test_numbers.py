"""Numbers both halves share: moving averages, finite values, JSON that never fails, decimation."""

from __future__ import annotations

import math

import pytest

from ptdash.shared.decimate import decimate
from ptdash.shared.numbers import ema, ema_series, finite_or_none, json_safe


def test_decimate_keeps_short_series_untouched():
    assert decimate([1, 2, 3], [1.0, 2.0, 3.0], 10) == ([1, 2, 3], [1.0, 2.0, 3.0])


def test_decimate_bounds_length_and_keeps_ends_and_spikes():
    steps = list(range(100_000))
    values = [math.sin(i / 1000) for i in steps]
    values[54_321] = 50.0
    values[77_777] = -50.0
    s, v = decimate(steps, values, 500)
    assert len(s) <= 500
    assert s[0] == 0 and s[-1] == 99_999
    assert s == sorted(s)
    assert 50.0 in v and -50.0 in v
    assert s[v.index(50.0)] == 54_321


def test_decimate_keeps_min_and_max_of_each_bucket():
    steps = list(range(10))
    values = [0, 5, 1, 2, 9, 3, 4, 8, 6, 7]
    s, v = decimate(steps, values, 6)  # both ends, plus 2 buckets of 4 inner points
    assert s == [0, 2, 4, 5, 7, 9]
    assert v == [0, 1, 9, 3, 8, 7]


def test_decimate_is_none_safe():
    steps = list(range(20))
    values = [None if 5 <= i < 15 else float(i) for i in steps]
    s, v = decimate(steps, values, 8)
    assert len(s) <= 8
    assert None in v  # the gap stays visible
    assert all(x is None or isinstance(x, float) for x in v)


def test_ema_weights_new_values_by_alpha():
    assert ema_series([1.0, 3.0, 3.0], 0.5) == [1.0, 2.0, 2.5]
    assert ema_series([4.0, 0.0], 1.0) == [4.0, 0.0]


def test_ema_skips_none_without_poisoning():
    assert ema_series([None, 2.0, None, 4.0], 0.5) == [None, 2.0, None, 3.0]


def test_ema_with_steps_weights_gaps():
    # A point standing for 2 steps counts as two updates: 1 - 0.5**2 = 0.75.
    assert ema_series([0.0, 4.0], 0.5, steps=[0, 2]) == [0.0, 3.0]
    with pytest.raises(ValueError):
        ema_series([1.0], 0.0)


def test_ema():
    assert ema(None, 5.0, 0.1) == 5.0
    assert ema(5.0, 15.0, 0.1) == 6.0


def test_finite_or_none():
    assert finite_or_none(1.5) == 1.5 and finite_or_none(math.nan) is None and finite_or_none(-math.inf) is None


def test_json_safe_replaces_non_finite_numbers_anywhere_and_says_so():
    value, replaced = json_safe({"a": [1.0, math.nan, {"b": math.inf}], "c": (2, "x"), "d": ValueError("boom")})
    assert replaced and value == {"a": [1.0, None, {"b": None}], "c": [2, "x"], "d": "boom"}
    assert json_safe({"a": 1.0}) == ({"a": 1.0}, False)


def test_exits_in_words_and_as_a_shell_says_them():
    from ptdash.shared.exits import describe_exit, shell_status

    assert describe_exit(3) == "exit code 3" and describe_exit(-9) == "killed by SIGKILL"
    assert describe_exit(-200) == "killed by signal 200" and describe_exit(None) == "exit code unknown"
    assert shell_status(-9) == 137 and shell_status(-15) == 143 and shell_status(2) == 2
