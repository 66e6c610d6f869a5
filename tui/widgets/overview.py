"""The Overview tab: loss, LR, grad norm and speed charts over the log and events panes.

When runs are compared, the loss, LR and grad-norm charts overlay every run and a table
of each run's key figures sits under the charts.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Container, Horizontal
from textual.widget import Widget

from .. import compare
from ..state import RunState
from ..tabs import overview
from .chart_panel import ChartPanel
from .compare_table import CompareTable
from .events_pane import EventsPane
from .log_pane import LogPane

CHARTS = (
    ("loss", "loss", overview.loss),
    ("lr", "learning rate", overview.lr),
    ("grad", "grad norm", overview.grad),
    ("speed", "speed", overview.speed),
)
"""(id, title, builder) of each chart, in layout order."""

COMPARED = {"loss": compare.loss, "lr": compare.lr, "grad": compare.grad}
"""The charts that overlay the compared runs, and their builders."""


class Overview(Widget):
    """Lays out the first screen; the app hands it the RunState and calls ``refresh_charts``."""

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
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._seen: dict[str, tuple] = {}

    def compose(self) -> ComposeResult:
        with Container(id="charts"):
            for key, title, _ in CHARTS:
                yield ChartPanel(title, id=f"{key}-panel")
        yield CompareTable(id="compare-table")
        with Horizontal(id="panes"):
            yield LogPane(id="log")
            yield EventsPane(id="events")

    def refresh_charts(self, state: RunState, runs: list[compare.Run] | None = None, by_time: bool = False) -> None:
        """Rebuild the charts whose data changed since the last call; with ``runs``, overlay them."""
        self.set_class(bool(runs), "-compare")
        for key, _, build in CHARTS:
            if runs and key in COMPARED:
                fingerprint: tuple = ("compare", compare.versions(runs, by_time))
            else:
                fingerprint = _fingerprint(key, state)
            if self._seen.get(key) == fingerprint:
                continue
            self._seen[key] = fingerprint
            panel = self.query_one(f"#{key}-panel", ChartPanel)
            panel.legend, panel.chart = COMPARED[key](runs, by_time) if fingerprint[0] == "compare" else build(state)
        if runs:
            fingerprint = (compare.versions(runs, False), tuple(r.state or "" for r in runs))
            if self._seen.get("table") != fingerprint:
                self._seen["table"] = fingerprint
                self.query_one(CompareTable).rows = [(r.colour, compare.figures(r)) for r in runs]


def _fingerprint(key: str, state: RunState) -> tuple:
    others = tuple(n for n in state.series if n.startswith("opt") and n.endswith(("/loss", "/grad/norm_total")))
    names = {
        "loss": ("loss", *others),
        "lr": (*overview.lr_names(state.series), "user/lr"),
        "grad": ("grad/norm_total", "grad/clip_max", "grad/clipped", *others),
        "speed": ("throughput/samples_per_s", "time/step_s"),
    }[key]
    extra = (state.status.lr_scale if key == "lr" and state.status is not None else None,
             tuple(state.optimizers.items()), state.no_step)
    return names, overview.versions(state, names), extra
