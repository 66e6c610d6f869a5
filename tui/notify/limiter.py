"""At most one call a kind a minute: ``RateLimiter``. Pure (the clock is passed in)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .notices import Notice

INTERVAL_S = 60.0
"""The least time between two calls for one kind."""
EARLIER_KEPT = 20
"""Held notices a summed call lists one by one (the count covers them all)."""


@dataclass(frozen=True)
class Call:
    """One call of the command: the newest notice of its kind, and the ones it sums."""

    notice: Notice
    count: int = 1
    earlier: list[Notice] = field(default_factory=list)


class RateLimiter:
    """Lets a kind's first notice through at once; later ones within ``interval_s`` of the
    last call of their kind are held, and go as one summed call when the interval is over
    (``due``), or into the end of the run's call (``held_summary``)."""

    def __init__(self, interval_s: float = INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._last: dict[str, float] = {}
        self._held: dict[str, list[Notice]] = {}
        self._counts: dict[str, int] = {}

    def offer(self, notice: Notice, now: float) -> Call | None:
        """The call to make now for ``notice``, or None when its kind must wait (it is held)."""
        last = self._last.get(notice.kind)
        if last is not None and now - last < self.interval_s:
            held = self._held.setdefault(notice.kind, [])
            held.append(notice)
            self._counts[notice.kind] = self._counts.get(notice.kind, 0) + 1
            del held[:-EARLIER_KEPT - 1]
            return None
        self._last[notice.kind] = now
        return Call(notice)

    def due(self, now: float) -> list[Call]:
        """The summed calls of the kinds whose interval is over."""
        calls = []
        for kind in [k for k, held in self._held.items() if held and now - self._last[k] >= self.interval_s]:
            *earlier, newest = self._held.pop(kind)
            calls.append(Call(newest, self._counts.pop(kind), earlier))
            self._last[kind] = now
        return calls

    def held_summary(self) -> dict[str, dict]:
        """What is still held, per kind (count, first and newest step and message), and forget it:
        the end of the run's call tells it, so nothing waits a minute after the run."""
        out = {}
        for kind, held in self._held.items():
            if held:
                out[kind] = {"count": self._counts[kind], "first_step": held[0].step, "step": held[-1].step,
                             "message": held[-1].message}
        self._held.clear()
        self._counts.clear()
        return out
