"""Asked on quit while the run is live: stop it, leave it running, or stay."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label


class QuitDialog(ModalScreen[str | None]):
    """Dismisses with ``"stop"``, ``"detach"``, or None (cancel)."""

    BINDINGS = [
        Binding("escape", "dismiss(None)", "Cancel", id="quit-dialog.cancel"),
        Binding("s", "choose('stop')", "Stop training", id="quit-dialog.stop"),
        Binding("d,l", "choose('detach')", "Leave running", id="quit-dialog.detach"),
        # The buttons are stacked: the arrow keys move between them, as Tab does.
        Binding("down", "app.focus_next", show=False),
        Binding("up", "app.focus_previous", show=False),
    ]

    DEFAULT_CSS = """
    QuitDialog {
        align: center middle;
    }
    QuitDialog > Vertical {
        width: 46;
        height: auto;
        padding: 1 2;
        border: thick $accent;
        background: $surface;
    }
    QuitDialog Label {
        width: 100%;
        margin-bottom: 1;
    }
    QuitDialog Button {
        width: 100%;
        margin-top: 0;
    }
    """

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("The run is still training. What now?")
            yield Button("Leave running in background", id="detach", variant="primary")
            yield Button("Stop training", id="stop", variant="error")
            yield Button("Cancel", id="cancel")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(None if event.button.id == "cancel" else event.button.id)

    def action_choose(self, choice: str) -> None:
        self.dismiss(choice)
