"""Lists every key the dashboard answers to, and what it does."""

from __future__ import annotations

from collections.abc import Callable

from rich.table import Table
from rich.text import Text
from textual.actions import parse as parse_action
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static


def key_rows(bindings: list[Binding], check: Callable[[str, tuple], bool | None]) -> list[tuple[str, str, bool]]:
    """(key, description, available now) of each binding, once each; ``check`` is ``check_action``."""
    rows, seen = [], set()
    for binding in bindings:
        key = binding.key_display or binding.key
        if (key, binding.action) in seen:
            continue
        seen.add((key, binding.action))
        _, name, parameters = parse_action(binding.action)
        rows.append((key, binding.description, check(name, parameters) is True))
    return rows


class HelpScreen(ModalScreen[None]):
    """Shows ``rows`` of (key, description, available now); any listed close key dismisses."""

    BINDINGS = [
        Binding("escape,q,question_mark", "dismiss(None)", "Close", id="help.close"),
    ]

    DEFAULT_CSS = """
    HelpScreen {
        align: center middle;
    }
    HelpScreen > Vertical {
        width: 84;
        max-width: 100%;
        height: auto;
        max-height: 90%;
        padding: 1 2;
        border: thick $accent;
        background: $surface;
    }
    """

    def __init__(self, rows: list[tuple[str, str, bool]], note: str = "") -> None:
        super().__init__()
        self.rows = rows
        self.note = note

    def compose(self) -> ComposeResult:
        # Two columns of keys, so every key fits on an 80x24 terminal.
        table = Table.grid(padding=(0, 2))
        for _ in range(2):
            table.add_column(style="bold", no_wrap=True)
            table.add_column(no_wrap=True)
        half = (len(self.rows) + 1) // 2
        for left, right in zip(self.rows[:half], self.rows[half:] + [("", "", True)]):
            cells = []
            for key, description, enabled in (left, right):
                style = "" if enabled else "dim"
                cells += [Text(key, style), Text(description, style)]
            table.add_row(*cells)
        with Vertical():
            yield Static("[b]ptdash keys[/b]")
            yield Static(table)
            yield Static(f"[dim]{self.note or 'Dimmed keys are not available now. Esc closes.'}[/dim]")
