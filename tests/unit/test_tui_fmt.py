"""How numbers read on the dashboard: durations, SI and byte sizes, ETAs, command names."""

import pytest

from ptdash.tui.fmt import command_text, eta, fmt_bytes, fmt_duration, fmt_ms, fmt_num, fmt_si


@pytest.mark.parametrize("seconds, text", [
    (None, "—"), (-1, "—"), (0, "0s"), (0.04, "40ms"), (0.44, "0.4s"), (0.96, "1s"), (45.4, "45s"), (185, "3m05s"), (3720, "1h02m"), (183600, "2d03h"),
])
def test_fmt_duration(seconds, text):
    assert fmt_duration(seconds) == text


@pytest.mark.parametrize("value, text", [
    (None, "N/A"), (0, "0"), (950, "950"), (12_345, "12.3k"), (1_234_567, "1.23M"), (3e9, "3G"),
    (0.123, "0.123"), (0.0123, "0.0123"), (3e-4, "3e-4"), (2.5e-5, "2.5e-5"), (-0.00042, "-4.2e-4"),
    (999.8, "1k"), (float("inf"), "inf"), (100, "100"), (123.456, "123"), (1.5, "1.5"),
])
def test_fmt_si(value, text):
    assert fmt_si(value) == text


def test_fmt_si_digits():
    assert fmt_si(100, 2) == "100"
    assert fmt_si(1e5, 2) == "100k" and fmt_si(2.5e8, 1) == "250M"  # never 1e+02k
    assert fmt_si(2.7994, 4) == "2.799"
    assert fmt_si(0.0027994, 2) == "2.8e-3"


@pytest.mark.parametrize("value, text", [
    (None, "N/A"), (512, "512 B"), (1536, "1.5 KiB"), (3.5 * 2**30, "3.5 GiB"), (2**50, "1024.0 TiB"),
])
def test_fmt_bytes(value, text):
    assert fmt_bytes(value) == text


def test_eta():
    assert eta(500, 2000, 10.0) == 150.0
    assert eta(2500, 2000, 10.0) == 0
    assert eta(500, None, 10.0) is None
    assert eta(500, 2000, None) is None
    assert eta(500, 2000, 0.0) is None


def test_command_text():
    assert command_text("clip", 0.5) == "clip 0.5"
    assert command_text("clip", None) == "clip off"
    assert command_text("lr_scale", 0.25) == "LR ×0.25"
    assert command_text("profile", 5) == "profile 5 steps"
    assert command_text("pause", None) == "pause"


def test_fmt_ms():
    assert fmt_ms(None) == "N/A"
    assert fmt_ms(0.0123) == "12.3 ms"
    assert fmt_ms(1.25) == "1.25 s"


@pytest.mark.parametrize("value, text", [
    (1e18, "1e18"), (2.5e20, "2.5e20"), (-3e16, "-3e16"), (9.99e14, "999T"),
])
def test_fmt_si_has_no_prefix_past_tera(value, text):
    assert fmt_si(value) == text


@pytest.mark.parametrize("value, text", [
    (None, "N/A"), (0, "0"), (0.53214, "0.5321"), (12.5, "12.5"), (3e-4, "3e-4"), (1000.0, "1000"),
    (48213.4, "48213"), (1.2e7, "1.2e7"), (1e30, "1e30"), (-0.25, "-0.25"), (float("nan"), "nan"), (2.0, "2"),
])
def test_fmt_num_never_adds_a_prefix(value, text):
    assert fmt_num(value) == text
