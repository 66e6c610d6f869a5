"""The Metrics tab: every series of the run in a grid of small charts, paged.

``/`` filters the series by a regular expression (as W&B's LEET does), the arrows move the
selection, PageDown/PageUp turn the page, Enter zooms the selected chart to the whole tab
(Enter or Esc again goes back), ``*`` pins it to the Overview (``Pin`` up to the app).
What each chart draws is ``tabs.metrics``; the app hands the RunState in ``refresh_metrics``.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Container, Horizontal
from textual.message import Message
from textual.widget import Widget
from textual.widgets import Input, Static

from ..state import RunState
from ..tabs import metrics
from .chart_panel import ChartPanel

MAX_CELLS = 16
"""Charts a page holds at most (the pool of panels made once)."""
CELL_WIDTH = 38
"""The narrowest a small chart gets: columns of the grid are the tab's width over this."""
CELL_HEIGHT = 6
"""The lowest a small chart gets (its border and x labels included)."""


class MetricsView(Widget, can_focus=True):
    """The grid, its filter and its zoomed chart; posts ``Pin`` when a chart is pinned."""

    BINDINGS = [
        Binding("slash", "filter", "Filter the series (a regular expression)", key_display="/",
                id="metrics.filter", show=False),
        Binding("enter", "zoom", "Zoom the selected chart (and back)", id="metrics.zoom", show=False),
        Binding("asterisk", "pin", "Pin the selected chart to the Overview (again: unpin)", key_display="*",
                id="metrics.pin", show=False),
        Binding("pagedown", "page(1)", "Next page of charts", key_display="pgdn", id="metrics.next", show=False),
        Binding("pageup", "page(-1)", "Previous page of charts", key_display="pgup", id="metrics.previous",
                show=False),
        Binding("right", "select(1)", "Select the next chart", id="metrics.right", show=False),
        Binding("left", "select(-1)", "Select the previous chart", id="metrics.left", show=False),
        Binding("down", "select_row(1)", "Select the chart below", id="metrics.down", show=False),
        Binding("up", "select_row(-1)", "Select the chart above", id="metrics.up", show=False),
        Binding("escape", "back", "Leave the zoom, or clear the filter", key_display="esc", id="metrics.back",
                show=False),
    ]

    DEFAULT_CSS = """
    MetricsView {
        height: 1fr;
    }
    MetricsView #metrics-bar {
        height: 1;
    }
    MetricsView #metrics-filter {
        width: 30;
        height: 1;
        border: none;
        padding: 0 1;
        display: none;
    }
    MetricsView.-filtering #metrics-filter {
        display: block;
    }
    MetricsView #metrics-summary {
        width: 1fr;
        height: 1;
        padding: 0 1;
        color: $text-muted;
    }
    MetricsView #metrics-grid {
        layout: grid;
        grid-gutter: 0 0;
        height: 1fr;
    }
    MetricsView #metrics-grid ChartPanel {
        height: 1fr;
        min-height: 4;
    }
    MetricsView #metrics-grid ChartPanel.-selected {
        border: round $accent;
    }
    MetricsView #metrics-zoom {
        display: none;
    }
    MetricsView.-zoomed #metrics-grid {
        display: none;
    }
    MetricsView.-zoomed #metrics-zoom {
        display: block;
    }
    """

    @dataclass
    class Pin(Message):
        """The user pinned ``name`` to the Overview (None: unpinned)."""

        name: str | None

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.state = RunState()
        self.smoothing = 0.0
        """The EMA the charts draw over their raw lines (0: none: the grid shows what was recorded)."""
        self.pattern = None
        self.filter_text = ""
        self.page_index = 0
        self.selected = 0
        """The selected chart's place on the page."""
        self.zoomed: str | None = None
        self.pinned: str | None = None
        self.shown: list[str] = []
        """The names the filter keeps, in the grid's order."""
        self.error = ""
        self._drawn: dict[int, tuple] = {}

    def compose(self) -> ComposeResult:
        with Horizontal(id="metrics-bar"):
            yield Input(placeholder="regular expression", id="metrics-filter")
            yield Static(id="metrics-summary")
        with Container(id="metrics-grid"):
            for i in range(MAX_CELLS):
                yield ChartPanel("", id=f"metrics-cell-{i}")
        yield ChartPanel("", id="metrics-zoom")

    # ---------------------------------------------------------------- data in

    def refresh_metrics(self, state: RunState) -> None:
        """Take the run's state and redraw what changed, when the tab is on screen."""
        self.state = state
        if self.is_mounted and self.region.height > 0:
            self._draw()

    def on_show(self) -> None:
        self._draw(force=True)

    def on_resize(self, _: events.Resize) -> None:
        self._draw(force=True)

    def _shape(self) -> tuple[int, int]:
        width, height = self.size.width, max(1, self.size.height - 1)
        cols = max(1, width // CELL_WIDTH)
        rows = max(1, min(height // CELL_HEIGHT, MAX_CELLS // cols))
        return cols, rows

    def _draw(self, force: bool = False) -> None:
        if not self.is_mounted or self.size.width == 0:
            return
        if force:
            self._drawn.clear()
        self.shown = metrics.matching(metrics.series_names(self.state), self.pattern)
        cols, rows = self._shape()
        grid = self.query_one("#metrics-grid")
        grid.styles.grid_size_columns, grid.styles.grid_size_rows = cols, rows
        now = metrics.page(self.shown, self.page_index, cols * rows)
        self.page_index = now.index
        self.selected = min(self.selected, max(0, len(now.names) - 1))
        for i in range(MAX_CELLS):
            cell = self.query_one(f"#metrics-cell-{i}", ChartPanel)
            name = now.names[i] if i < len(now.names) else None
            cell.display = name is not None
            cell.set_class(name is not None and i == self.selected, "-selected")
            if name is None:
                continue
            key = (name, metrics.versions(self.state, [name]), self.smoothing, self.pinned == name)
            if self._drawn.get(i) == key:
                continue
            self._drawn[i] = key
            drawn = metrics.panel(self.state, name, i, self.smoothing)
            cell.title = f"{'* ' if name == self.pinned else ''}{name}"
            cell.legend, cell.chart, cell.note = drawn
        if self.zoomed is not None:
            zoom = self.query_one("#metrics-zoom", ChartPanel)
            drawn = metrics.panel(self.state, self.zoomed, 0, self.smoothing)
            zoom.title = self.zoomed
            zoom.legend, zoom.chart, zoom.note = drawn
        self._summarize(now)

    def _summarize(self, now: metrics.Page) -> None:
        total = len(metrics.series_names(self.state))
        parts = [f"{total} series"]
        if self.pattern is not None:
            parts.append(f"/{self.filter_text}/ keeps {len(self.shown)}")
        if now.count > 1:
            parts.append(f"page {now.index + 1} of {now.count} (pgdn/pgup)")
        parts.append("/ filter  enter zoom  * pin")
        text = Text("  ·  ".join(parts), "dim")
        if self.error:
            text = Text.assemble((self.error, "bold red"), "  ", text)
        self.query_one("#metrics-summary", Static).update(text)

    def selected_name(self) -> str | None:
        """The name of the selected chart, None on an empty page."""
        cols, rows = self._shape()
        names = metrics.page(self.shown, self.page_index, cols * rows).names
        return names[self.selected] if self.selected < len(names) else None

    # ------------------------------------------------------------------- keys

    def action_filter(self) -> None:
        self.add_class("-filtering")
        box = self.query_one("#metrics-filter", Input)
        box.value = self.filter_text
        box.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        try:
            self.pattern = metrics.compile_filter(event.value)
        except ValueError as exc:
            self.error = str(exc)
            self._draw()
            return
        self.error, self.filter_text = "", event.value.strip()
        self.page_index = self.selected = 0
        self.remove_class("-filtering")
        self.focus()
        self._draw(force=True)

    def action_back(self) -> None:
        if self.has_class("-filtering"):
            self.remove_class("-filtering")
            self.error = ""
            self.focus()
        elif self.zoomed is not None:
            self.zoomed = None
            self.remove_class("-zoomed")
        elif self.pattern is not None:
            self.pattern, self.filter_text = None, ""
            self.page_index = self.selected = 0
        self._draw(force=True)

    def action_zoom(self) -> None:
        if self.zoomed is not None:
            self.zoomed = None
        else:
            self.zoomed = self.selected_name()
        self.set_class(self.zoomed is not None, "-zoomed")
        self._draw(force=True)

    def action_pin(self) -> None:
        name = self.zoomed or self.selected_name()
        if name is None:
            return
        self.pinned = None if self.pinned == name else name
        self.post_message(self.Pin(self.pinned))
        self.notify(f"{name} pinned to the Overview" if self.pinned else f"{name} unpinned", timeout=3)
        self._draw(force=True)

    def action_page(self, by: int) -> None:
        self.page_index += by
        self.selected = 0
        self._draw(force=True)

    def action_select(self, by: int) -> None:
        self._move(by)

    def action_select_row(self, by: int) -> None:
        self._move(by * self._shape()[0])

    def _move(self, by: int) -> None:
        cols, rows = self._shape()
        count = len(metrics.page(self.shown, self.page_index, cols * rows).names)
        if count:
            self.selected = min(max(0, self.selected + by), count - 1)
            self._draw()
