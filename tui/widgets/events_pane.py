"""Command acknowledgements and engine events, one timestamped line each."""

from __future__ import annotations

import time

from rich.text import Text

from ..eventline import EventLine
from .follow_log import FollowLog

LEVEL_STYLES = {"ok": "green", "error": "bold red", "warning": "yellow", "dim": "dim", "info": "",
                "finding": "bold magenta"}


STAMP_FROM = 48
"""The narrowest pane whose lines start with the time; a narrower one gives the room to what happened."""


def event_text(line: EventLine, width: int = STAMP_FROM) -> Text:
    """``12:01:03 step 540 clip 0.5 applied`` styled by level (without the time in a narrow pane)."""
    text = Text(line.text, LEVEL_STYLES.get(line.level, ""))
    if width >= STAMP_FROM:
        text = Text.assemble((time.strftime("%H:%M:%S ", time.localtime(line.wall)), "dim"), text)
    return text


class EventsPane(FollowLog[EventLine]):
    """What happened to the run: commands applied or refused, checkpoints, anomalies.

    One line each, cut to the pane's width (``w`` widens the pane); a command's line is
    the same line from "sent" to "applied", and a checkpoint's ack and event share one.
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(wrap=False, id=id, classes=classes)
        self.border_title = "events"

    def line(self, item: EventLine) -> Text:
        return event_text(item, self.scrollable_content_region.width)

    def add(self, lines: list[EventLine]) -> None:
        """Show new event lines below the others."""
        self.append(lines)

    def show(self, lines: list[EventLine]) -> None:
        """Show exactly ``lines`` (some shown ones changed: a command's ack, a merged checkpoint)."""
        self._items.clear()
        self._items.extend(lines)
        self.rewrite()
