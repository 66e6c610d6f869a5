"""A titled, bordered chart: the title and latest values in the top border, a note in the bottom one."""

from __future__ import annotations

import dataclasses

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from ..chart import Chart


class ChartPanel(Widget):
    """Draws whatever ``legend``, ``chart`` and ``note`` its parent hands it; posts nothing."""

    DEFAULT_CSS = """
    ChartPanel {
        height: 1fr;
        min-height: 4;
        border: round $panel-lighten-2;
        border-title-align: left;
        border-subtitle-align: right;
        border-subtitle-color: $text-muted;
        padding: 0;
    }
    """

    legend: reactive[Text] = reactive(Text, always_update=True, layout=False)
    """Latest values (or the cursor's) shown after the title, already styled."""

    chart: reactive[Chart] = reactive(Chart, always_update=True, layout=False)
    """The chart to draw; replaced (never mutated) when its data changes."""

    note: reactive[Text] = reactive(Text, always_update=True, layout=False)
    """What the view does to this chart (smoothing, scale) or why part of it is missing."""

    def __init__(self, title: str, *, name: str | None = None, id: str | None = None,
                 classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.title = title
        self.border_title = Text(title, "bold")

    def watch_legend(self, legend: Text) -> None:
        self.border_title = Text.assemble((self.title, "bold"), "  ", legend) if legend else Text(self.title, "bold")

    def watch_note(self, note: Text) -> None:
        self.border_subtitle = note if note else None

    def render(self) -> Chart:
        return dataclasses.replace(self.chart, height=max(1, self.content_size.height))
