"""The key figures of runs compared side by side: one row per run, in the run's colour."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from ..compare import FIGURES, fit_columns


class CompareTable(Widget):
    """Draws the rows its parent hands it (``compare.figures`` of each run); posts nothing."""

    DEFAULT_CSS = """
    CompareTable {
        height: auto;
        padding: 0 1;
    }
    """

    rows: reactive[list[tuple[str, list[str]]]] = reactive(list, always_update=True, layout=True)
    """``(colour, figures)`` of each run, the main run first."""

    def render(self) -> Table:
        # Columns that do not fit are left out whole, the least needed first, rather than cut.
        # The run's cell carries its colour's marker: "■ name".
        shown = fit_columns([["■ " + cells[0], *cells[1:]] for _, cells in self.rows], self.content_size.width)
        table = Table(box=None, padding=(0, 1), expand=False, show_edge=False, header_style="bold")
        for i in shown:
            table.add_column(FIGURES[i], justify="left" if i < 2 else "right", no_wrap=True, overflow="ellipsis")
        for colour, cells in self.rows:
            run = Text.assemble(("■ ", colour), (cells[0], colour))
            table.add_row(*(run if i == 0 else cells[i] for i in shown))
        return table
