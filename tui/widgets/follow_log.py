"""A log that follows its newest line and lays its lines out again when its width changes."""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

from rich.text import Text
from textual import events
from textual.widgets import RichLog

Item = TypeVar("Item")


class FollowLog(RichLog, Generic[Item]):
    """Keeps the items it shows (up to ``MAX_LINES``) and draws each with ``line(item)``.

    RichLog lays a line out once, when it is written; this one writes everything again at
    a new width, so a wrapped (or cut) line always fits the pane as it is now. It shows no
    scrollbar (lines are wrapped or cut to the width; the wheel and keys still scroll back).
    """

    DEFAULT_CSS = """
    FollowLog {
        height: 1fr;
        background: $surface;
        scrollbar-size-vertical: 0;
        overflow-x: hidden;
    }
    """

    MAX_LINES = 500

    def __init__(self, *, wrap: bool, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(max_lines=self.MAX_LINES, min_width=10, wrap=wrap, markup=False, highlight=False,
                         auto_scroll=True, id=id, classes=classes)
        self._items: deque[Item] = deque(maxlen=self.MAX_LINES)
        self._laid_out_at = 0

    def line(self, item: Item) -> Text:
        """The text of one item (cut with an ellipsis when the log does not wrap)."""
        raise NotImplementedError

    def append(self, items: list[Item]) -> None:
        """Show more items, below the others."""
        self._items.extend(items)
        for item in items:
            self._write(item)

    def rewrite(self) -> None:
        """Draw every item again (one of them changed, or the width did)."""
        self.clear()
        for item in self._items:
            self._write(item)

    def _write(self, item: Item) -> None:
        text = self.line(item)
        width = self.scrollable_content_region.width
        if not self.wrap and width > 0:
            text.no_wrap, text.overflow = True, "ellipsis"
            text.truncate(width, overflow="ellipsis")
        self.write(text, scroll_end=None)

    def on_resize(self, event: events.Resize) -> None:
        width = self.scrollable_content_region.width
        if width != self._laid_out_at and self._items:
            self._laid_out_at = width
            self.rewrite()
