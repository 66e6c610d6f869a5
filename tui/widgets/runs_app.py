"""The runs view's app: the list of runs (``runsview.run_rows``), filtered, marked, opened.

Keys: ``/`` filter, Space mark, Enter open (the marked runs, else the one under the cursor),
Esc clear the filter, q quit. ``RunsApp(rows).run()`` returns the run dirs chosen, ``[]`` on quit.
"""

from __future__ import annotations

import time

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.widgets import DataTable, Footer, Input, Static

from ..fmt import fmt_num
from ..runsview import RunRow, matching

STATE_STYLES = {"live": "bold green", "paused": "yellow", "stalled": "bold yellow", "finished": "cyan",
                "stopped": "cyan", "crashed": "bold red", "lost": "red"}


def _started(wall: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(wall)) if wall else ""


class RunsApp(App[list]):
    """The list of runs; returns the run dirs to open (``[]``: none)."""

    TITLE = "ptdash runs"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [
        Binding("space", "mark", "Mark/unmark the run", id="runs.mark"),
        Binding("enter", "open", "Open (the marked runs overlaid)", id="runs.open", priority=True),
        Binding("slash", "filter", "Filter", key_display="/", id="runs.filter"),
        Binding("escape", "clear", "Clear the filter", key_display="esc", id="runs.clear", show=False),
        Binding("q", "quit_runs", "Quit", id="runs.quit"),
    ]
    DEFAULT_CSS = """
    #runs-bar { height: 1; }
    #runs-filter { display: none; height: 1; border: none; padding: 0 1; }
    RunsApp.-filtering #runs-filter { display: block; }
    #runs-summary { height: 1; padding: 0 1; color: $text-muted; }
    #runs-table { height: 1fr; }
    """

    def __init__(self, rows: list[RunRow]) -> None:
        super().__init__()
        self.rows = rows
        self.shown: list[RunRow] = list(rows)
        self.marked: list[Path] = []
        """The marked runs, in the order they were marked (the first is the main one)."""
        self.filter_text = ""

    def compose(self) -> ComposeResult:
        yield Static(id="runs-summary")
        yield Input(placeholder="filter: words in the name, state or parent", id="runs-filter")
        yield DataTable(id="runs-table", cursor_type="row", zebra_stripes=True)
        yield Footer(compact=True)

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        table.add_columns(" ", "name", "state", "steps", "loss", "started", "parent")
        self._fill()
        table.focus()

    def _fill(self) -> None:
        table = self.query_one(DataTable)
        table.clear()
        self.shown = matching(self.rows, self.filter_text)
        for row in self.shown:
            mark = f"{self.marked.index(row.path) + 1}" if row.path in self.marked else ""
            table.add_row(Text(mark, "bold magenta"), row.name, Text(row.state, STATE_STYLES.get(row.state, "")),
                          "" if row.step is None else f"{row.step:,}", fmt_num(row.loss, 4) if row.loss is not None
                          else "", _started(row.started), row.parent, key=str(row.path))
        parts = [f"{len(self.rows)} runs here"]
        if self.filter_text:
            parts.append(f"filter {self.filter_text!r} keeps {len(self.shown)}")
        parts.append(f"{len(self.marked)} marked" if self.marked else "space marks runs, enter opens them overlaid")
        self.query_one("#runs-summary", Static).update("  ·  ".join(parts))

    def _cursor_row(self) -> RunRow | None:
        table = self.query_one(DataTable)
        if not self.shown or table.cursor_row is None or table.cursor_row >= len(self.shown):
            return None
        return self.shown[table.cursor_row]

    def action_mark(self) -> None:
        row = self._cursor_row()
        if row is None:
            return
        if row.path in self.marked:
            self.marked.remove(row.path)
        else:
            self.marked.append(row.path)
        at = self.query_one(DataTable).cursor_row
        self._fill()
        self.query_one(DataTable).move_cursor(row=min(at + 1, len(self.shown) - 1))

    def action_open(self) -> None:
        if self.has_class("-filtering"):
            box = self.query_one("#runs-filter", Input)
            self.filter_text = box.value.strip()
            self.remove_class("-filtering")
            self.query_one(DataTable).focus()
            self._fill()
            return
        row = self._cursor_row()
        chosen = list(self.marked) or ([row.path] if row is not None else [])
        if chosen:
            self.exit(chosen)

    def action_filter(self) -> None:
        self.add_class("-filtering")
        box = self.query_one("#runs-filter", Input)
        box.value = self.filter_text
        box.focus()

    def action_clear(self) -> None:
        self.remove_class("-filtering")
        self.filter_text = ""
        self.query_one(DataTable).focus()
        self._fill()

    def action_quit_runs(self) -> None:
        self.exit([])
