"""A scrolling view of one Rich report (the System and Profiler tabs)."""

from __future__ import annotations

from collections.abc import Callable

from rich.console import RenderableType
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from ..state import RunState


class ReportView(VerticalScroll):
    """Redraws ``build(state, width)`` when ``fingerprint(state)`` changed and the view is shown."""

    DEFAULT_CSS = """
    ReportView {
        height: 1fr;
        scrollbar-size-vertical: 1;
    }
    ReportView > Static {
        width: 1fr;
    }
    """

    def __init__(self, build: Callable[[RunState, int], RenderableType], fingerprint: Callable[[RunState], object],
                 *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.build = build
        self.fingerprint = fingerprint
        self._state: RunState | None = None
        self._seen: object = None

    def compose(self) -> ComposeResult:
        yield Static()

    def refresh_report(self, state: RunState, force: bool = False) -> None:
        """Redraw from ``state`` when what the report reads changed (or ``force``)."""
        self._state = state
        if not self.is_mounted or self.region.height == 0:
            return  # hidden: redrawn when shown
        key = (self.fingerprint(state), self.size.width)
        if key == self._seen and not force:
            return
        self._seen = key
        self.query_one(Static).update(self.build(state, max(20, self.size.width - 1)))

    def on_show(self) -> None:
        if self._state is not None:
            self.refresh_report(self._state)

    def on_resize(self) -> None:
        if self._state is not None:
            self.refresh_report(self._state)
