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


def size_arg(text: str) -> int:
    """``--rollback-memory``: bytes, or with a unit (``512M``, ``4G``, ``1.5GB``, ``2GiB``)."""
    typed = text.strip().upper().removesuffix("IB").removesuffix("B")
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    scale = units.get(typed[-1:], 1) if typed else 1
    try:
        value = float(typed[:-1] if typed[-1:] in units else typed) * scale
    except ValueError:
        value = float("nan")
    if not value >= 1 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"takes a size such as 512M or 4G, got {text[:32]!r}")
    return int(value)


def factor_steps_arg(text: str) -> tuple[float, int]:
    """``--rollback-lr F:S``: an LR factor 0 < F <= 1 for S >= 1 steps."""
    try:
        f, s = text.split(":")
        factor, steps = float(f), int(s)
        if not (0 < factor <= 1 and steps >= 1):
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes F:S, a factor 0 < F <= 1 for S >= 1 steps (0.5:100), "
                                         f"got {text[:32]!r}") from None
    return factor, steps


def limit_arg(text: str) -> tuple[int, int]:
    """``--rollback-limit N:M``: at most N rollbacks within M steps, whole numbers >= 1."""
    try:
        n, m = (int(x) for x in text.split(":"))
        if n < 1 or m < 1:
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes N:M, whole numbers >= 1 (3:1000), got {text[:32]!r}") from None
    return n, m


def add_anomaly_arguments(p: argparse.ArgumentParser) -> None:
    """``--on-anomaly`` and the options of its rollback (docs/rollback.md)."""
    p.add_argument("--on-anomaly", choices=("pause", "skip", "warn", "rollback"), default="pause",
                   help="on a non-finite loss or gradient: pause before the update (default), skip the "
                        "update, only warn, or roll back to the last good state (a spike too)")
    p.add_argument("--rollback-every", type=count_arg(1), metavar="K",
                   help="refresh the rollback snapshot every K steps (default: as often as the overhead "
                        "budget affords, at least every 10; 100 under DDP)")
    p.add_argument("--rollback-memory", type=size_arg, metavar="SIZE",
                   help="host memory the rollback snapshots may take, e.g. 4G (default: a quarter of the RAM)")
    p.add_argument("--rollback-lr", type=factor_steps_arg, metavar="F:S",
                   help="after a rollback, multiply the LR factor by F for S steps (e.g. 0.5:100)")
    p.add_argument("--rollback-limit", type=limit_arg, default=(3, 1000), metavar="N:M",
                   help="more than N rollbacks within M steps pause the run instead (stop it when a pause "
                        "would time out unanswered); default 3:1000")


def notify_kinds_arg(text: str) -> frozenset[str]:
    """``--notify-on``: which kinds of event ``--notify`` tells."""
    from .notify.watcher import parse_kinds

    try:
        return parse_kinds(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--notify-on ")) from None


def add_notify_arguments(p: argparse.ArgumentParser) -> None:
    """``--notify``, ``--notify-on`` (docs/notify.md) and ``--no-terminal-notify``."""
    from .notify import KINDS

    p.add_argument("--notify", metavar="CMD",
                   help="run the shell command CMD for the events that need a person (the run's end, a pause "
                        "on an anomaly, a rollback, a stall, a restart): one JSON object on its stdin, "
                        "PTDASH_EVENT and PTDASH_RUN in its environment; at most one call a kind a minute")
    p.add_argument("--notify-on", type=notify_kinds_arg, default=frozenset(KINDS), metavar="KINDS",
                   help=f"the kinds --notify tells, comma-separated, of {','.join(KINDS)} (default: all)")
    p.add_argument("--no-terminal-notify", dest="terminal_notify", action="store_false",
                   help="the dashboard sends no desktop notification (OSC 9/777) and no bell for those events")
