"""What a live setting may be: the documented ranges of the clip norm, the LR factor and the
profile length, and the one check every input path uses.

The CLI options (``--clip``, ``--lr-scale``, ``--profile-steps``), ``ptdash ctl``, the
dashboard's dialogs and the engine all call ``check_setting`` (through ``parse_setting``
for typed text, ``validate_command`` for what arrives on the socket), so a value refused
in one place is refused in all of them. The ranges keep a typo from hurting training: an
LR factor of 1e308 overflows the optimizer's arithmetic at the next step, a clip norm of
1e-30 freezes the model. Nothing here raises on bad input; it says what is wrong in one
line. Stdlib only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .protocol import COMMANDS, Command


@dataclass(frozen=True)
class Bound:
    """The range of one setting, and how it reads in a message."""

    what: str
    low: float
    high: float
    text: str
    """The range as a person reads it: ``from 1e-6 to 1000``."""
    whole: bool = False


BOUNDS = {
    "clip": Bound("clip norm", 1e-6, 1e6, "from 1e-6 to 1e6"),
    "lr_scale": Bound("LR factor", 1e-6, 1e3, "from 1e-6 to 1000"),
    "profile": Bound("profile length", 1, 1000, "a whole number of steps from 1 to 1000", whole=True),
}
"""The settings commands carry, by command name. ``clip`` may also be None (off)."""

MAX_COMMAND_ID = 64
"""Characters in a command id; ids are short random strings."""


def show(value: Any, limit: int = 24) -> str:
    """``value`` as a message quotes it: its repr, cut short (a 5000-digit integer has none)."""
    try:
        text = repr(value)
    except ValueError:  # an int too long for str(): Python refuses to print it
        return "a number too long to print"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def check_setting(name: str, value: Any) -> str | None:
    """Why ``value`` cannot be the setting ``name`` (``clip``, ``lr_scale``, ``profile``), or None.

    Never raises: any object gets an answer.
    """
    problem = _problem(BOUNDS[name], value)
    return None if problem is None else f"{problem}, got {show(value)}"


def _problem(bound: Bound, value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{bound.what} must be a number"
    # Compared without converting: float() of a huge int overflows, int/float comparison is exact.
    finite = not isinstance(value, float) or math.isfinite(value)
    if bound.whole:
        if not (finite and bound.low <= value <= bound.high and value == int(value)):
            return f"{bound.what} must be {bound.text}"
    elif not finite or value <= 0:
        return f"{bound.what} must be a finite number > 0 ({bound.text})"
    elif not bound.low <= value <= bound.high:
        return f"{bound.what} must be {bound.text}"
    return None


def parse_setting(name: str, text: str) -> float | int | None:
    """The setting ``name`` as a person typed it; ``off`` (or ``none``) turns the clip off.

    A profile length comes back as an int. Raises ValueError with a one-line message that
    quotes the text as typed.
    """
    bound = BOUNDS[name]
    typed = text.strip()
    if name == "clip" and typed.lower() in ("off", "none"):
        return None
    try:
        value = float(typed)
    except ValueError:
        off = " or off" if name == "clip" else ""
        raise ValueError(f"{bound.what} must be a number{off}, got {show(typed, 32)}") from None
    problem = _problem(bound, value)
    if problem is not None:
        raise ValueError(f"{problem}, got {show(typed, 32)}")
    return int(value) if bound.whole else value


def parse_positive(text: str, what: str) -> float:
    """A finite number > 0 typed by a person (an interval, a timeout).

    Raises ValueError with a one-line message fit to show under the field.
    """
    typed = text.strip()
    try:
        value = float(typed)
    except ValueError:
        raise ValueError(f"{what} must be a number, got {show(typed, 32)}") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{what} must be a finite number > 0, got {show(typed, 32)}")
    return value


def validate_command(cmd: Command) -> str | None:
    """Why ``cmd`` cannot be applied, or None when it is valid. Never raises.

    The dashboard and ``ptdash ctl`` check the same rules before sending; the engine
    checks again because the socket may carry anything.
    """
    if not isinstance(cmd.id, str) or not 0 < len(cmd.id) <= MAX_COMMAND_ID \
            or not (cmd.id.isascii() and cmd.id.isprintable()):
        return f"a command id is 1 to {MAX_COMMAND_ID} printable ASCII characters"
    if cmd.name not in COMMANDS:
        return f"unknown command {show(cmd.name, 32)}"
    if cmd.name == "clip" and cmd.value is None:
        return None
    if cmd.name in BOUNDS:
        return check_setting(cmd.name, cmd.value)
    if cmd.value is not None:
        return f"{cmd.name} takes no value, got {show(cmd.value)}"
    return None
