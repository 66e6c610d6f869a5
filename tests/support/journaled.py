"""A journal's ``event(what, message)`` for the engine's parts under test, outside an engine."""

from __future__ import annotations

from typing import Callable

from ptdash.shared import events


def journaled(append: Callable[[str, str, dict], None]) -> Callable:
    """An ``event(what, message)`` that hands ``append`` the ``(kind, message, data)`` the store would hold
    (the hub's also takes the run.json ``info`` an event changes, left out here)."""

    def event(what: events.EventData | str, message: str, info: dict | None = None) -> None:
        kind, data = (what, {}) if isinstance(what, str) else events.encode(what)
        append(kind, message, data)

    return event
