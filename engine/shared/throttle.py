"""A budget for repeated notes: at most ``burst`` in each ``window`` of seconds, and a count
of the rest, so a flood of bad frames or refused commands costs engine.log and the
journal a few lines, not thousands. Stdlib only.
"""

from __future__ import annotations

import time
from typing import Callable


class Throttle:
    """Says whether the next note may be written, and how many were held back before it.

    ``clock`` is the time source (``time.monotonic``; tests pass their own).
    """

    def __init__(self, burst: int = 10, window: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.burst = burst
        self.window = window
        self._clock = clock
        self._start = clock()
        self._written = 0
        self.held = 0
        """Notes held back since the last one written."""

    def allow(self) -> tuple[bool, int]:
        """``(True, held)`` when this note may be written, ``held`` being how many were held
        back since the last written one (it should say so); ``(False, 0)`` otherwise."""
        now = self._clock()
        if now - self._start >= self.window:
            self._start, self._written = now, 0
        if self._written >= self.burst:
            self.held += 1
            return False, 0
        self._written += 1
        held, self.held = self.held, 0
        return True, held
