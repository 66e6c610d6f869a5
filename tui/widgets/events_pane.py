"""Command acknowledgements and engine events, one timestamped line each."""

from __future__ import annotations

import time

from rich.text import Text

from ..state import EventLine
from .follow_log import FollowLog

LEVEL_STYLES = {"ok": "green", "error": "bold red", "warning": "yellow", "dim": "dim", "info": "",
                "finding": "bold magenta"}


def event_text(line: EventLine) -> Text:
    """``12:01:03 step 540 clip 0.5 applied`` styled by level."""
    stamp = time.strftime("%H:%M:%S", time.localtime(line.wall))
    return Text.assemble((stamp + " ", "dim"), (line.text, LEVEL_STYLES.get(line.level, "")))


class EventsPane(FollowLog[EventLine]):
    """What happened to the run: commands applied or refused, checkpoints, anomalies.

    One line each, cut to the pane's width (``w`` widens the pane); a command's line is
    the same line from "sent" to "applied", and a checkpoint's ack and event share one.
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(wrap=False, id=id, classes=classes)
        self.border_title = "events"

    def line(self, item: EventLine) -> Text:
        return event_text(item)

    def add(self, lines: list[EventLine]) -> None:
        """Show new event lines below the others."""
        self.append(lines)

    def show(self, lines: list[EventLine]) -> None:
        """Show exactly ``lines`` (some shown ones changed: a command's ack, a merged checkpoint)."""
        self._items.clear()
        self._items.extend(lines)
        self.rewrite()
