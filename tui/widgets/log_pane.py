"""The tail of the script's output.log, long lines wrapped to the pane."""

from __future__ import annotations

from rich.text import Text

from .follow_log import FollowLog


class LogPane(FollowLog[str]):
    """Lines the training script printed, newest at the bottom; follows unless scrolled up."""

    MAX_LINES = 2000

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(wrap=True, id=id, classes=classes)
        self.border_title = "output"

    def line(self, item: str) -> Text:
        # Verbatim: never parsed as markup, the script may print anything.
        style = "red" if item.startswith(("Traceback", "Error", "RuntimeError")) else ""
        return Text(item.expandtabs(), style=style)

    def add_lines(self, lines: list[str]) -> None:
        """Append lines as printed."""
        self.append(lines[-self.MAX_LINES:])
