"""One line of the dashboard's events pane, and how loud each kind of event is there. Pure."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EventLine:
    """One line of the events pane: when, at which step, what, and how loud."""

    wall: float
    step: int | None
    text: str
    level: str = "info"
    """``info``, ``ok``, ``warning``, ``error`` or ``dim``."""
    kind: str = ""
    """The event kind it shows (``checkpoint``...), or ``command`` for a command's own line."""
    command_id: str | None = None
    """The command whose line this is, from "sent" to its ack."""


EVENT_LEVELS = {"anomaly": "error", "oom": "error", "warning": "warning", "hint": "warning", "checkpoint": "ok",
                "finding": "finding"}
"""How loud each event kind is in the events pane (a doctor's finding has a look of its own)."""
