"""Command acknowledgements and engine events, one timestamped line each."""

from __future__ import annotations

import time
from collections import deque

from rich.text import Text
from textual import events
from textual.widgets import RichLog

from ..state import EventLine

LEVEL_STYLES = {"ok": "green", "error": "bold red", "warning": "yellow", "dim": "dim", "info": "",
                "finding": "bold magenta"}


def event_text(line: EventLine) -> Text:
    """``12:01:03 step 540 clip 0.5 applied`` styled by level."""
    stamp = time.strftime("%H:%M:%S", time.localtime(line.wall))
    return Text.assemble((stamp + " ", "dim"), (line.text, LEVEL_STYLES.get(line.level, "")))


class EventsPane(RichLog):
    """What happened to the run: commands applied or refused, checkpoints, anomalies."""

    DEFAULT_CSS = """
    EventsPane {
        height: 1fr;
        background: $surface;
        scrollbar-size-vertical: 1;
    }
    """

    MAX_LINES = 500

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(max_lines=self.MAX_LINES, min_width=10, wrap=True, markup=False, highlight=False,
                         auto_scroll=True, id=id, classes=classes)
        self.border_title = "events"
        self._events: deque[EventLine] = deque(maxlen=self.MAX_LINES)
        self._wrapped_at = 0

    def add(self, lines: list[EventLine]) -> None:
        """Append event lines (wrapped to the pane's width)."""
        self._events.extend(lines)
        for line in lines:
            self.write(event_text(line), scroll_end=None)

    def on_resize(self, event: events.Resize) -> None:
        # RichLog wraps once, at write time; re-wrap everything when the width changes.
        width = self.scrollable_content_region.width
        if width != self._wrapped_at and self._events:
            self._wrapped_at = width
            self.clear()
            for line in self._events:
                self.write(event_text(line), scroll_end=True)
