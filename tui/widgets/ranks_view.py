"""The Ranks tab: one row per DDP rank, every rank's stacks when asked (``k``) or kept by a
stall, over a chart of every rank's step time."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from ..state import RunState
from ..tabs import ranks
from .chart_panel import ChartPanel


class RanksView(Vertical):
    """Redraws the rank table and chart from the RunState its parent hands it, when shown."""

    DEFAULT_CSS = """
    RanksView {
        height: 1fr;
    }
    RanksView > #ranks-table {
        height: auto;
        max-height: 60%;
        width: 1fr;
    }
    RanksView > #ranks-stacks {
        height: auto;
        max-height: 70%;
        width: 1fr;
    }
    RanksView > #ranks-chart {
        height: 1fr;
        min-height: 5;
        padding: 0 1;
    }
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._state: RunState | None = None
        self._seen: object = None

    def compose(self) -> ComposeResult:
        yield Static(id="ranks-table")
        yield Static(id="ranks-stacks")
        yield ChartPanel("step time per rank", id="ranks-chart")

    def refresh_ranks(self, state: RunState) -> None:
        """Redraw from ``state`` when what the tab reads changed; nothing while hidden."""
        self._state = state
        if not self.is_mounted or self.region.height == 0:
            return  # hidden: redrawn when shown
        key = (ranks.versions(state), self.size.width)
        if key == self._seen:
            return
        self._seen = key
        self.query_one("#ranks-table", Static).update(ranks.table(state, self.size.width))
        shown = ranks.stacks_view(state, self.size.width)
        panel = self.query_one("#ranks-stacks", Static)
        panel.display = shown is not None and state.world_size > 1
        if shown is not None:
            panel.update(shown)
        chart = self.query_one("#ranks-chart", ChartPanel)
        chart.display = state.world_size > 1
        chart.legend, chart.chart = ranks.step_chart(state)

    def on_show(self) -> None:
        if self._state is not None:
            self.refresh_ranks(self._state)

    def on_resize(self) -> None:
        if self._state is not None:
            self.refresh_ranks(self._state)
