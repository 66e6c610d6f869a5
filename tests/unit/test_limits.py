"""The live settings' ranges, checked in one place for every input path, and the throttle
that keeps a flood of refusals from flooding the logs."""

from __future__ import annotations

import math

import pytest

from ptdash.shared.limits import BOUNDS, check_setting, parse_setting, validate_command
from ptdash.shared.protocol import Command
from ptdash.shared.throttle import Throttle


@pytest.mark.parametrize("name, value, needle", [
    ("lr_scale", 1e308, "LR factor must be from 1e-6 to 1000, got 1e+308"),
    ("lr_scale", 0.0, "LR factor must be a finite number > 0"),
    ("lr_scale", 1e-7, "from 1e-6 to 1000"),
    ("lr_scale", 10 ** 400, "from 1e-6 to 1000"),
    ("clip", math.inf, "clip norm must be a finite number > 0"),
    ("clip", math.nan, "clip norm must be a finite number > 0"),
    ("clip", -3, "finite number > 0"),
    ("clip", 1e7, "clip norm must be from 1e-6 to 1e6"),
    ("clip", "abc", "clip norm must be a number, got 'abc'"),
    ("clip", True, "must be a number"),
    ("profile", 1e12, "profile length must be a whole number of steps from 1 to 1000"),
    ("profile", 2.5, "whole number"),
    ("profile", 0, "whole number"),
    ("profile", math.inf, "whole number"),
])
def test_out_of_range_settings_are_refused_in_one_line(name, value, needle):
    error = check_setting(name, value)
    assert error is not None and needle in error and "\n" not in error


def test_an_integer_too_long_to_print_is_refused_without_printing_it():
    assert check_setting("lr_scale", 10 ** 5000).endswith("got a number too long to print")


@pytest.mark.parametrize("name, value", [
    ("lr_scale", 1e-6), ("lr_scale", 1000), ("lr_scale", 0.5), ("clip", 1e-6), ("clip", 1e6),
    ("profile", 1), ("profile", 1000), ("profile", 5.0),
])
def test_the_ends_of_each_range_are_allowed(name, value):
    assert check_setting(name, value) is None


def test_typed_text_is_parsed_and_quoted_as_typed():
    assert parse_setting("clip", " 0.5 ") == 0.5
    assert parse_setting("clip", "OFF") is None
    assert parse_setting("profile", "5") == 5 and isinstance(parse_setting("profile", "5"), int)
    for name, text, needle in (("lr_scale", "1e308", "got '1e308'"), ("clip", "1e309", "got '1e309'"),
                               ("profile", "1e12", "got '1e12'"), ("clip", "abc", "a number or off, got 'abc'"),
                               ("clip", "", "got ''"), ("lr_scale", "off", "LR factor must be a number"),
                               ("lr_scale", "9" * 5000, "got '999")):
        with pytest.raises(ValueError, match=needle) as caught:
            parse_setting(name, text)
        assert len(str(caught.value)) < 120


@pytest.mark.parametrize("cmd, needle", [
    (Command(id="x", name="lr_scale", value=1e308), "LR factor must be from"),
    (Command(id="x", name="lr_scale", value=None), "LR factor must be a number"),
    (Command(id="x", name="profile", value=1e12), "profile length"),
    (Command(id="x", name="pause", value=1.0), "pause takes no value"),
    (Command(id="x", name="\udcff" * 40), "unknown command"),
    (Command(id="", name="pause"), "command id"),
    (Command(id="x" * 65, name="pause"), "command id"),
    (Command(id="\udcff", name="pause"), "command id"),
])
def test_commands_are_validated_without_raising(cmd, needle):
    assert needle in validate_command(cmd)


def test_valid_commands_pass():
    for cmd in (Command(id="a-1", name="clip", value=None), Command(id="a", name="clip", value=2),
                Command(id="a", name="stop"), Command(id="a", name="profile", value=5)):
        assert validate_command(cmd) is None


def test_the_ranges_are_the_documented_ones():
    assert (BOUNDS["lr_scale"].low, BOUNDS["lr_scale"].high) == (1e-6, 1e3)
    assert (BOUNDS["clip"].low, BOUNDS["clip"].high) == (1e-6, 1e6)
    assert (BOUNDS["profile"].low, BOUNDS["profile"].high) == (1, 1000)


def test_the_throttle_allows_a_burst_per_window_and_counts_the_rest():
    now = [0.0]
    throttle = Throttle(burst=3, window=10.0, clock=lambda: now[0])
    assert [throttle.allow() for _ in range(5)] == [(True, 0)] * 3 + [(False, 0)] * 2
    assert throttle.held == 2
    now[0] = 9.9
    assert throttle.allow() == (False, 0)
    now[0] = 10.0
    assert throttle.allow() == (True, 3)  # the first of the next window says what it held back
    assert throttle.held == 0
