"""The Layers tab: every parameter's gradient norm, history, update ratio and flag.

The rows come from ``tabs.layers.select`` over the app's LayerStats; the LayerTable draws
only those on screen. The view re-sorts at most every UPDATE_S when new statistics
arrive (at once when the sort, filter or grouping changes); once the user moves the
cursor, it stays on that parameter while the values move the rows under it.
"""

from __future__ import annotations

import time

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.reactive import reactive
from textual.timer import Timer
from textual.widget import Widget
from textual.widgets import Input, Static

from ..chart import Chart, Line
from ..fmt import fmt_num
from ..tabs.layers import FLAG_STYLES, SORT_LABELS, SORTS, LayerRow, LayerStats, select
from .chart_panel import ChartPanel
from .layer_table import Column, LayerTable

SPARK_WIDTH = 12
"""History cells per row."""

UPDATE_S = 0.5
"""Shortest time between two table updates from new data (filter and sort apply at once)."""

WIDE = 100
"""From this width on, the shape column is shown (when the engine sent shapes)."""

FIXED = (Column("shape", "shape", 11), Column("norm", "grad norm", 9, "right"), Column("spark", "history", SPARK_WIDTH),
         Column("ratio", "Δw/w", 8, "right"), Column("flag", "flag", 9))
"""Every column but the name, in order."""

HEADER_SORTS = {"name": "name", "norm": "norm", "spark": "norm", "ratio": "ratio", "flag": "flag"}
"""What a click on a column header sorts by."""


class LayersView(Widget):
    """The app hands it the LayerStats through ``refresh_layers``; the view owns the rest."""

    BINDINGS = [
        Binding("slash", "filter", "Filter layers", key_display="/", id="layers.filter", show=False),
        Binding("o", "cycle_sort", "Sort layers", id="layers.sort", show=False),
        Binding("m", "toggle_group", "Group by module", id="layers.group", show=False),
        Binding("escape", "close_chart", "Close layer chart", key_display="esc", id="layers.close", show=False),
    ]

    DEFAULT_CSS = """
    LayersView {
        height: 1fr;
    }
    LayersView #layers-bar {
        height: 1;
    }
    LayersView #layers-filter {
        width: 28;
        height: 1;
        border: none;
        padding: 0 1;
    }
    LayersView #layers-summary {
        width: 1fr;
        height: 1;
        padding: 0 1;
        color: $text-muted;
    }
    LayersView LayerTable {
        height: 1fr;
    }
    LayersView #layer-chart {
        height: 9;
        display: none;
        border-top: solid $panel-lighten-2;
    }
    LayersView.-charted #layer-chart {
        display: block;
    }
    """

    sort: reactive[str] = reactive("name")
    """The row order, one of ``tabs.layers.SORTS``."""

    grouped: reactive[bool] = reactive(False)
    """Rows are modules (parameters combined by their name prefix) instead of parameters."""

    filter_text: reactive[str] = reactive("")
    """Only rows whose name holds every word of this are shown."""

    selected: reactive[str | None] = reactive(None)
    """The row whose history is charted (None: no chart)."""

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.stats = LayerStats()
        self.shards = False
        self.kept: dict | None = None
        """The engine's counts of what it kept (steps, per-layer norms), for the summary line."""
        self.rows: list[LayerRow] = []
        """What the table shows now, in order."""
        self.last_update_s = 0.0
        """Seconds the latest update took to sort, filter and hand the rows over (not the paint)."""
        self._seen_version = -1
        self._updated_at = 0.0
        self._cursor_name: str | None = None
        self._timer: Timer | None = None

    def compose(self) -> ComposeResult:
        with Horizontal(id="layers-bar"):
            yield Input(placeholder="/ filter by name", id="layers-filter")
            yield Static(id="layers-summary")
        yield LayerTable(id="layers-table")
        yield ChartPanel("grad norm", id="layer-chart")

    def on_mount(self) -> None:
        self._summarize()

    # ------------------------------------------------------------------- watchers

    def watch_sort(self) -> None:
        self._reorder()

    def watch_grouped(self) -> None:
        self.selected = None
        self._reorder()

    def watch_filter_text(self) -> None:
        self._reorder()

    def watch_selected(self, name: str | None) -> None:
        self.set_class(name is not None, "-charted")
        self._chart()

    # ---------------------------------------------------------------- data in

    def refresh_layers(self, stats: LayerStats, shards: bool = False, kept: dict | None = None) -> None:
        """New statistics may have arrived: update the table, at most every UPDATE_S while shown.
        ``shards``: the parameters are sharded (FSDP), so each norm is of rank 0's part of one;
        ``kept``: at how many steps the engine kept per-layer norms (tabs.system.kept_counts)."""
        self.stats = stats
        if shards != self.shards or (kept is not None and kept != self.kept):
            self.shards = shards
            self.kept = kept if kept is not None else self.kept
            if self.is_mounted:
                self._summarize()
        if stats.version == self._seen_version or not self._on_screen() or self._timer is not None:
            return
        wait = self._updated_at + UPDATE_S - time.monotonic()
        if wait > 0:
            self._timer = self.set_timer(wait, self._deferred)
            return
        self._update()

    def _deferred(self) -> None:
        self._timer = None
        self.refresh_layers(self.stats, self.shards)

    def _on_screen(self) -> bool:
        return self.is_mounted and self.region.height > 0

    def on_show(self) -> None:
        self._update()

    def on_resize(self, event: events.Resize) -> None:
        self._update()

    # ----------------------------------------------------------------- table

    def _columns(self) -> tuple[Column, ...]:
        width = self.size.width
        shapes = width >= WIDE and any(shape is not None for shape in self.stats.shapes)
        fixed = tuple(c for c in FIXED if c.key != "shape" or shapes)
        name_width = max(12, width - sum(c.width + 2 for c in fixed) - 3)
        return (Column("name", "name", name_width), *fixed)

    def _reorder(self) -> None:
        """Sort, filter or grouping changed: redraw now, with the cursor back on the first row."""
        self._cursor_name = None
        self._update()
        if self.is_mounted:
            table = self.query_one(LayerTable)
            table.move_to(0)
            table.scroll_home(animate=False)

    def _update(self) -> None:
        if not self.is_mounted or self.size.width == 0:
            return
        started = time.perf_counter()
        stats, grouped = self.stats, self.grouped
        self._seen_version = stats.version
        self._updated_at = time.monotonic()
        self.rows = rows = select(stats.rows(grouped), self.filter_text, self.sort)
        table = self.query_one(LayerTable)
        table.set_rows(rows, self._columns(), lambda row: tuple(stats.recent(row, grouped, SPARK_WIDTH)))
        self._follow_cursor(table)
        self._summarize()
        self._chart()
        self.last_update_s = time.perf_counter() - started

    def _follow_cursor(self, table: LayerTable) -> None:
        """Once the user put the cursor on a row, keep it there while new values move the rows.

        Until then the cursor keeps its position, so a table sorted by grad norm keeps
        showing its top rows.
        """
        if self._cursor_name is None:
            return
        for i, row in enumerate(self.rows):
            if row.name == self._cursor_name:
                table.move_to(i)
                return

    def _summarize(self) -> None:
        stats = self.stats
        if not stats.names:
            self.query_one("#layers-summary", Static).update("no per-layer gradients yet")
            return
        what = "modules" if self.grouped else "parameters"
        total = len(stats.modules()) if self.grouped else len(stats)
        count = f"{len(self.rows)}/{total}" if self.filter_text.strip() else f"{total}"
        parts = [f"{count} {what}", f"sort {SORT_LABELS[self.sort]} (o)",
                 f"{'parameters' if self.grouped else 'modules'} (m)"]
        if stats.step is not None:
            parts.append(f"step {stats.step:,}")
        if self.kept and self.kept.get("steps"):  # how often, as counts: never "every step" where it was not
            parts.append(f"norms kept at {self.kept['layers']:,} of {self.kept['steps']:,} steps")
        if self.shards:  # what a sharded parameter's norm here is: not the whole parameter's
            parts.insert(1, "rank 0's shards (each norm: its part of the parameter)")
        self.query_one("#layers-summary", Static).update(" · ".join(parts))

    def _chart(self) -> None:
        name = self.selected
        if name is None or not self.is_mounted:
            return
        panel = self.query_one("#layer-chart", ChartPanel)
        steps, norms = self.stats.history_of(name, self.grouped)
        row = next((r for r in self.rows if r.name == name), None)
        legend = Text(name, "bold")
        if row is not None:
            legend.append("  ")
            legend.append(fmt_num(row.norm, 4) if row.norm is not None else "N/A", "bold magenta")
            if row.ratio is not None:
                legend.append(f"  Δw/w {fmt_num(row.ratio, 2)}", "dim")
            if row.flag:
                legend.append(f"  {row.flag}", FLAG_STYLES[row.flag])
        panel.title = "grad norm of module" if self.grouped else "grad norm of"
        panel.legend = legend
        panel.chart = Chart([Line(steps, norms, "magenta")], log_y="auto", empty_text="no history yet")

    # ----------------------------------------------------------------- events

    def on_layer_table_highlighted(self, event: LayerTable.Highlighted) -> None:
        event.stop()
        self._cursor_name = event.row.name  # from now on the cursor follows this row
        if self.selected is not None:
            self.selected = event.row.name  # an open chart follows the cursor

    def on_layer_table_selected(self, event: LayerTable.Selected) -> None:
        event.stop()
        self._cursor_name = event.row.name
        self.selected = event.row.name

    def on_layer_table_header_clicked(self, event: LayerTable.HeaderClicked) -> None:
        event.stop()
        sort = HEADER_SORTS.get(event.key)
        if sort is not None:
            self.sort = sort

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self.filter_text = event.value

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.focus_table()

    def on_key(self, event: events.Key) -> None:
        if event.key == "escape" and self.query_one(Input).has_focus:
            event.stop()
            self.focus_table()

    # ---------------------------------------------------------------- actions

    def focus_table(self) -> None:
        """Put the keyboard on the table (the app calls this when the tab opens)."""
        self.query_one(LayerTable).focus()

    def action_filter(self) -> None:
        self.query_one(Input).focus()

    def action_cycle_sort(self) -> None:
        self.sort = SORTS[(SORTS.index(self.sort) + 1) % len(SORTS)]

    def action_toggle_group(self) -> None:
        self.grouped = not self.grouped

    def action_close_chart(self) -> None:
        self.selected = None

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "close_chart":
            return self.selected is not None
        return True
