"""How a process ended, in words and as a shell would report it, and how long a stop may take. Stdlib only."""

from __future__ import annotations

import os
import signal


def _grace() -> float:
    try:
        value = float(os.environ.get("PTDASH_STOP_GRACE", "20"))
    except ValueError:
        return 20.0
    return value if 0 < value < 86400 else 20.0


STOP_GRACE_S = _grace()
"""Seconds a SIGTERM's stop waits for a step boundary before the engine stops the script
between steps (unattended.py; ``PTDASH_STOP_GRACE`` sets it, for a scheduler whose notice is
shorter or longer), and past which the headless front starts to count an unanswered stop
(tui/hardstop.py)."""


def describe_exit(code: object) -> str:
    """``exit code 3``, ``killed by SIGKILL`` (a negative code is a signal, as subprocess reports it)."""
    if isinstance(code, bool) or not isinstance(code, int):
        return "exit code unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def shell_status(code: int) -> int:
    """The status a shell gives a process that ended with ``code``: 128 + N for signal N."""
    return 128 - code if code < 0 else code
