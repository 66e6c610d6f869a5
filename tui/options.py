"""The run options' values: what each option of ``ptdash [options] script.py`` takes,
parsed for argparse, with the one-line error a bad value gets (``cli`` exits 2 with it)."""

from __future__ import annotations

import argparse
import os

from ptdash.shared.limits import parse_positive, parse_setting


def positive_arg(what: str):
    def parse(text: str) -> float:
        try:
            return parse_positive(text, what)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return parse


def setting_arg(name: str):
    def parse(text: str) -> float | None:
        try:
            return parse_setting(name, text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return parse


def count_arg(least: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < least:
            raise argparse.ArgumentTypeError(f"takes a whole number >= {least}, got {text[:32]!r}")
        return value
    return parse


def steps_arg(text: str) -> tuple[int, int]:
    try:
        a, b = (int(x) for x in text.split(":"))
        if not 1 <= a <= b:
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(f"--profile-steps takes A:B with 1 <= A <= B, got {text!r}") from None
    return a, b


NO_TERMINAL_PAUSE_TIMEOUT = 30 * 60.0
"""The pause timeout of a headless run with no terminal attached (a batch job, CI)."""


def duration_arg(text: str) -> float:
    """``--pause-timeout``: seconds (``90``, ``90s``), minutes or hours; 0 for ``none``."""
    if text.strip().lower() in ("none", "off", "never"):
        return 0.0
    units = {"s": 1, "m": 60, "h": 3600}
    try:
        if text[-1:] in units:
            return parse_positive(text[:-1], "duration") * units[text[-1]]
        return parse_positive(text, "duration")
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes a duration like 90, 30m or 2h (or none), got {text[:32]!r}") from None


def has_terminal() -> bool:
    """Whether a person may be at a terminal of this command: a standard stream is one,
    or the process has a controlling terminal."""
    if any(os.isatty(fd) for fd in (0, 1, 2)):
        return True
    try:
        os.close(os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY))
    except OSError:
        return False
    return True


def every_arg(text: str) -> tuple[str, float]:
    units = {"s": 1, "m": 60, "h": 3600}
    try:
        if text[-1:] in units:
            return ("seconds", parse_positive(text[:-1], "interval") * units[text[-1]])
        steps = int(text)
        if steps <= 0:
            raise ValueError
        return ("steps", steps)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--checkpoint-every takes a step count or a time like 30m, got {text!r}") from None
