"""How a process ended, in words and as a shell would report it. Stdlib only."""

from __future__ import annotations

import signal


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
