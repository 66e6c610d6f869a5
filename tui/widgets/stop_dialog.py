"""Confirms a stop: cleanly at the next step boundary, or a kill right now."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label


class StopDialog(ModalScreen[str | None]):
    """Dismisses with ``"stop"``, ``"kill"``, or None (cancel)."""

    BINDINGS = [
        Binding("escape", "dismiss(None)", "Cancel", id="stop-dialog.cancel"),
        Binding("enter,s", "choose('stop')", "Stop cleanly", id="stop-dialog.stop"),
        Binding("k", "choose('kill')", "Kill now", id="stop-dialog.kill"),
        # The buttons are stacked: the arrow keys move between them, as Tab does.
        Binding("down", "app.focus_next", show=False),
        Binding("up", "app.focus_previous", show=False),
    ]

    DEFAULT_CSS = """
    StopDialog {
        align: center middle;
    }
    StopDialog > Vertical {
        width: 52;
        height: auto;
        padding: 1 2;
        border: thick $error;
        background: $surface;
    }
    StopDialog Label {
        width: 100%;
        margin-bottom: 1;
    }
    StopDialog Button {
        width: 100%;
    }
    """

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("Stop training? A clean stop ends the script at the next step "
                        "boundary; a kill ends it now, losing unsaved work.")
            yield Button("Stop cleanly", id="stop", variant="warning")
            yield Button("Kill now", id="kill", variant="error")
            yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#stop", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(None if event.button.id == "cancel" else event.button.id)

    def action_choose(self, choice: str) -> None:
        self.dismiss(choice)
