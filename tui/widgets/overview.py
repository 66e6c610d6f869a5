"""The Overview tab: loss, LR, grad norm and speed charts (and the metrics the script
printed, when it printed some) over the log and events panes.

When runs are compared, the loss, LR and grad-norm charts overlay every run and a table
of each run's key figures sits under the charts.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Container, Horizontal
from textual.widget import Widget

from .. import compare
from ..state import RunState
from ..tabs import metrics, overview
from ..view import ChartView
from .chart_panel import ChartPanel
from .compare_table import CompareTable
from .events_pane import EventsPane
from .log_pane import LogPane

CHARTS = (("loss", "loss"), ("lr", "learning rate"), ("grad", "grad norm"), ("metrics", "printed"),
          ("speed", "speed"))
"""(id, title) of each chart, in layout order; what each draws is ``overview.CHARTS[id]``. The
metrics panel (what the script printed) shows only when there is some (``-printed``); the
series pinned from the Metrics tab (``-pinned``) takes the speed chart's place."""

COMPARED = {"loss": compare.loss, "lr": compare.lr, "grad": compare.grad, "metrics": compare.printed}
"""The charts that overlay the compared runs, and their builders."""

ZOOM = Binding.Group("Zoom")
CURSOR = Binding.Group("Cursor")

CHART_BINDINGS = [
    Binding("plus,equals_sign", "chart('zoom_in')", "Zoom in", key_display="+", id="chart.zoom_in", group=ZOOM),
    Binding("minus", "chart('zoom_out')", "Zoom out", key_display="-", id="chart.zoom_out", group=ZOOM),
    Binding("0", "chart('reset')", "Whole run (zoom back)", id="chart.reset", show=False),
    Binding("left_square_bracket", "chart('back')", "Pan the zoomed range back", key_display="[",
            id="chart.back", show=False),
    Binding("right_square_bracket", "chart('on')", "Pan the zoomed range on", key_display="]",
            id="chart.on", show=False),
    Binding("comma", "chart('left')", "Cursor left (< ten times)", key_display=",", id="chart.left",
            group=CURSOR),
    Binding("full_stop", "chart('right')", "Cursor right (> ten times)", key_display=".", id="chart.right",
            group=CURSOR),
    Binding("less_than_sign", "chart('far_left')", "Cursor far left", key_display="<", show=False,
            id="chart.far_left"),
    Binding("greater_than_sign", "chart('far_right')", "Cursor far right", key_display=">", show=False,
            id="chart.far_right"),
    Binding("escape", "chart('hide')", "Hide the cursor", key_display="esc", id="chart.hide", show=False),
    Binding("e", "chart('smooth')", "Smooth", id="chart.smooth"),
    Binding("y", "chart('scale')", "Log y", id="chart.scale"),
    Binding("v", "chart('metric')", "Next printed metric (the metrics panel)", id="chart.metric", show=False),
    Binding("w", "wide_events", "Widen the events pane", id="wide_events", show=False),
]
"""The chart keys (the app's: they work whatever has the focus); each runs ``ChartView.apply``."""


class Overview(Widget):
    """Lays out the first screen; the app hands it the RunState and the ChartView and calls
    ``refresh_charts``."""

    DEFAULT_CSS = """
    Overview {
        height: 1fr;
    }
    Overview > CompareTable {
        display: none;
    }
    Overview.-compare > CompareTable {
        display: block;
    }
    Overview #metrics-panel {
        display: none;
    }
    Overview.-printed #metrics-panel {
        display: block;
    }
    Overview #pinned-panel {
        display: none;
    }
    Overview.-pinned #pinned-panel {
        display: block;
    }
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._seen: dict[str, tuple] = {}

    def compose(self) -> ComposeResult:
        with Container(id="charts"):
            for key, title in CHARTS:
                yield ChartPanel(title, id=f"{key}-panel")
            yield ChartPanel("pinned", id="pinned-panel")
        yield CompareTable(id="compare-table")
        with Horizontal(id="panes"):
            yield LogPane(id="log")
            yield EventsPane(id="events")

    def toggle_wide_events(self) -> None:
        """The events pane takes the log's room (and back)."""
        self.toggle_class("-wide-events")

    def refresh_charts(self, state: RunState, view: ChartView, runs: list[compare.Run] | None = None,
                       by_time: bool = False) -> None:
        """Rebuild the charts whose data or view changed since the last call; with ``runs``,
        overlay them (the loss, LR and grad-norm charts)."""
        self.set_class(bool(runs), "-compare")
        seen = (view.span, view.end, view.cursor, view.smoothing, view.scale, view.metric)
        for key, _ in CHARTS:
            spec = overview.CHARTS[key]
            reads = spec.reads(state)
            if runs and key in COMPARED:
                fingerprint: tuple = ("compare", compare.versions(runs, by_time))
            else:
                fingerprint = (_fingerprint(state, reads), seen)
            if self._seen.get(key) == fingerprint:
                continue
            if key == "metrics":
                self.set_class(bool(reads), "-printed")
            self._seen[key] = fingerprint
            panel = self.query_one(f"#{key}-panel", ChartPanel)
            if fingerprint[0] == "compare":
                panel.legend, panel.chart = COMPARED[key](runs, by_time)
                panel.note = Text("by time" if by_time else "by step", "dim")
            else:
                panel.legend, panel.chart, panel.note = spec.draw(state, view, reads)
        self._refresh_pinned(state, view)
        if runs:
            fingerprint = (compare.versions(runs, False), tuple(r.state or "" for r in runs))
            if self._seen.get("table") != fingerprint:
                self._seen["table"] = fingerprint
                self.query_one(CompareTable).rows = [(r.colour, compare.figures(r)) for r in runs]

    def _refresh_pinned(self, state: RunState, view: ChartView) -> None:
        """The series pinned from the Metrics tab, in a chart of its own (none: hidden)."""
        self.set_class(view.pinned is not None, "-pinned")
        fingerprint = (view.pinned, metrics.versions(state, list(metrics.pinned_reads(state, view.pinned))),
                       view.smoothing)
        if self._seen.get("pinned") == fingerprint:
            return
        self._seen["pinned"] = fingerprint
        panel = self.query_one("#pinned-panel", ChartPanel)
        panel.legend, panel.chart, panel.note = metrics.pinned(state, view.pinned, view.smoothing)


def _fingerprint(state: RunState, reads: tuple[str, ...]) -> tuple:
    # Any chart's range may follow the others' (a zoomed view), and the LR panel the schedule.
    extra = (state.status.lr_scale if state.status is not None else None, id(state.schedule),
             overview.extent(state), tuple(state.optimizers.items()), state.no_step)
    return reads, overview.versions(state, reads), extra
