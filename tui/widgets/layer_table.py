"""A table of LayerRows drawn with Textual's line API: only the rows on screen are rendered.

DataTable re-renders through one ``refresh`` per changed cell, which costs about a
second for a re-sort of 500 rows on a loaded machine. This table takes a whole new row
list at once, and renders a row again only when that row, its history or the cursor on
it changed, so an update costs the sort plus the rows on screen.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rich.segment import Segment
from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from ..bars import sparkline
from ..fmt import fmt_num
from ..tabs.layers import FLAG_STYLES, LayerRow


@dataclass(frozen=True)
class Column:
    """One column: the LayerRow field it shows (``spark`` for the history), label, width."""

    key: str
    label: str
    width: int
    justify: str = "left"


def _fit(text: Text, width: int, justify: str) -> Text:
    text.truncate(width, overflow="ellipsis")
    pad = " " * (width - text.cell_len)
    return Text.assemble(pad, text) if justify == "right" else Text.assemble(text, pad)


def cell(row: LayerRow, column: Column, recent: tuple) -> Text:
    """The text of one cell, ``column.width`` cells wide (a long name keeps its end)."""
    key, width = column.key, column.width
    if key == "name":
        name = row.name if len(row.name) <= width else "…" + row.name[-(width - 1):]
        return Text(name.ljust(width))
    if key == "spark":
        return _fit(sparkline(recent, width, "magenta", log=True), width, "left")
    if key == "norm":
        if row.norm is None:
            text = Text("NaN/Inf" if row.flag == "nonfinite" else "N/A", FLAG_STYLES.get(row.flag or "", "dim"))
        else:
            text = Text(fmt_num(row.norm, 3), FLAG_STYLES.get(row.flag or "", ""))
        return _fit(text, width, "right")
    if key == "ratio":
        return _fit(Text(fmt_num(row.ratio, 2) if row.ratio is not None else ""), width, "right")
    if key == "flag":
        return _fit(Text(row.flag or "", FLAG_STYLES.get(row.flag or "", "")), width, "left")
    return _fit(Text(str(getattr(row, key))), width, column.justify)


def row_text(row: LayerRow, columns: tuple[Column, ...], recent: tuple, gap: int = 2) -> Text:
    """A whole row: its cells joined by ``gap`` spaces."""
    return Text(" " * gap).join(cell(row, c, recent) for c in columns)


class LayerTable(ScrollView, can_focus=True):
    """Draws ``rows`` under a fixed header; posts Highlighted, Selected and HeaderClicked."""

    BINDINGS = [
        Binding("up", "cursor(-1)", "Up", show=False),
        Binding("down", "cursor(1)", "Down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("home", "first", "First", show=False),
        Binding("end", "last", "Last", show=False),
        Binding("enter", "select", "Chart", show=False),
    ]

    COMPONENT_CLASSES = {"layer-table--header", "layer-table--cursor"}

    DEFAULT_CSS = """
    LayerTable {
        background: $surface;
        scrollbar-size-vertical: 1;
        overflow-x: hidden;  /* rows are cut to the width: a horizontal scrollbar would only show one column */
        & > .layer-table--header {
            text-style: bold;
            background: $panel;
        }
        & > .layer-table--cursor {
            background: $block-cursor-blurred-background;
            color: $block-cursor-blurred-foreground;
        }
        &:focus > .layer-table--cursor {
            background: $block-cursor-background;
            color: $block-cursor-foreground;
            text-style: $block-cursor-text-style;
        }
    }
    """

    cursor: reactive[int] = reactive(0, init=False)
    """Index of the highlighted row."""

    class Highlighted(Message):
        """The user moved the cursor onto ``row`` (keys; a click posts Selected)."""

        def __init__(self, row: LayerRow) -> None:
            super().__init__()
            self.row = row

    class Selected(Message):
        """``row`` was chosen (enter or a click)."""

        def __init__(self, row: LayerRow) -> None:
            super().__init__()
            self.row = row

    class HeaderClicked(Message):
        """The header of column ``key`` was clicked."""

        def __init__(self, key: str) -> None:
            super().__init__()
            self.key = key

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.rows: list[LayerRow] = []
        self.columns: tuple[Column, ...] = ()
        self.recent: Callable[[LayerRow], tuple] = lambda row: ()
        """The history a row's sparkline shows (the view knows where it lives)."""
        self._cache: dict[tuple, Strip] = {}

    def set_rows(self, rows: list[LayerRow], columns: tuple[Column, ...],
                 recent: Callable[[LayerRow], tuple]) -> None:
        """Show ``rows`` (and these columns); rows on screen that did not change are not redrawn."""
        if columns != self.columns:
            self._cache.clear()
        self.rows, self.columns, self.recent = rows, columns, recent
        self.virtual_size = Size(self.size.width, len(rows) + 1)
        if self.cursor >= len(rows):
            self.cursor = max(0, len(rows) - 1)
        self.refresh()

    # ------------------------------------------------------------------ drawing

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        base = self.rich_style
        if y == 0:
            style = self.get_component_rich_style("layer-table--header")
            header = Text("  ").join(_fit(Text(c.label), c.width, c.justify) for c in self.columns)
            return self._strip(header, width, base + style)
        index = self.scroll_offset.y + y - 1
        if not 0 <= index < len(self.rows):
            return Strip.blank(width, base)
        row = self.rows[index]
        recent = self.recent(row) if any(c.key == "spark" for c in self.columns) else ()
        key = (row, recent, index == self.cursor, width, self.has_focus)
        strip = self._cache.get(key)
        if strip is None:
            if len(self._cache) > 8 * max(1, self.size.height):
                self._cache.clear()
            style = base + self.get_component_rich_style("layer-table--cursor") if index == self.cursor else base
            strip = self._cache[key] = self._strip(row_text(row, self.columns, recent), width, style)
        return strip

    def _strip(self, text: Text, width: int, style) -> Strip:
        segments = [Segment(" ")] + list(text.render(self.app.console))
        return Strip(segments).apply_style(style).adjust_cell_length(width, style)

    # ------------------------------------------------------------------ cursor

    def watch_cursor(self) -> None:
        self._scroll_to_cursor()
        self.refresh()

    def _scroll_to_cursor(self) -> None:
        visible = max(1, self.scrollable_content_region.height - 1)
        top = self.scroll_offset.y
        if self.cursor < top:
            self.scroll_to(y=self.cursor, animate=False)
        elif self.cursor >= top + visible:
            self.scroll_to(y=self.cursor - visible + 1, animate=False)

    def move_to(self, index: int) -> None:
        """Put the cursor on row ``index`` (clamped), as the program; no message is posted."""
        self.cursor = min(max(0, index), max(0, len(self.rows) - 1))

    def _user_move(self, index: int) -> None:
        self.move_to(index)
        if self.rows:
            self.post_message(self.Highlighted(self.rows[self.cursor]))

    def action_cursor(self, delta: int) -> None:
        self._user_move(self.cursor + delta)

    def action_page(self, direction: int) -> None:
        self._user_move(self.cursor + direction * max(1, self.scrollable_content_region.height - 2))

    def action_first(self) -> None:
        self._user_move(0)

    def action_last(self) -> None:
        self._user_move(len(self.rows) - 1)

    def action_select(self) -> None:
        if 0 <= self.cursor < len(self.rows):
            self.post_message(self.Selected(self.rows[self.cursor]))

    def on_click(self, event: events.Click) -> None:
        event.stop()
        if event.y == 0:
            x = 1
            for column in self.columns:
                if x <= event.x < x + column.width + 2:
                    self.post_message(self.HeaderClicked(column.key))
                    return
                x += column.width + 2
            return
        index = self.scroll_offset.y + event.y - 1
        if 0 <= index < len(self.rows):
            self.move_to(index)
            self.post_message(self.Selected(self.rows[index]))
