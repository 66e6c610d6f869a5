"""The tail of the script's output.log."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import RichLog


class LogPane(RichLog):
    """Lines the training script printed, newest at the bottom; follows unless scrolled up."""

    DEFAULT_CSS = """
    LogPane {
        height: 1fr;
        background: $surface;
        scrollbar-size-vertical: 1;
    }
    """

    MAX_LINES = 2000

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(max_lines=self.MAX_LINES, wrap=False, markup=False, highlight=False,
                         auto_scroll=True, id=id, classes=classes)
        self.border_title = "output"

    def add_lines(self, lines: list[str]) -> None:
        """Append lines verbatim (never parsed as markup: the script may print anything)."""
        for line in lines[-self.MAX_LINES:]:
            style = "red" if line.startswith(("Traceback", "Error", "RuntimeError")) else ""
            self.write(Text(line.expandtabs(), style=style), scroll_end=None)
