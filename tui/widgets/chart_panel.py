"""A titled chart: one line of title and latest values, the braille chart below it."""

from __future__ import annotations

from rich.console import Group
from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from ..chart import Chart


class ChartPanel(Widget):
    """Draws whatever ``legend`` and ``chart`` its parent hands it; posts nothing."""

    DEFAULT_CSS = """
    ChartPanel {
        height: 1fr;
        min-height: 4;
        padding: 0 1 0 0;
    }
    """

    legend: reactive[Text] = reactive(Text, always_update=True, layout=False)
    """Latest values shown after the title, already styled."""

    chart: reactive[Chart] = reactive(Chart, always_update=True, layout=False)
    """The chart to draw; replaced (never mutated) when its data changes."""

    def __init__(self, title: str, *, name: str | None = None, id: str | None = None,
                 classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.title = title

    def render(self) -> Group:
        header = Text.assemble((self.title, "bold"), "  ", self.legend, no_wrap=True, overflow="ellipsis")
        chart = Chart(self.chart.lines, self.chart.log_y, self.chart.hlines,
                      height=max(1, self.content_size.height - 1), empty_text=self.chart.empty_text)
        return Group(header, chart)
