"""Asks for one positive number (clip norm, LR factor), refusing bad input in place."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

from ptdash.shared.protocol import parse_positive


class ValueDialog(ModalScreen[float | str | None]):
    """Dismisses with the number, ``"off"`` (when ``allow_off``), or None (cancel).

    Input is checked with ``protocol.parse_positive``; an error is shown under the field
    and nothing is returned until the input is valid.
    """

    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel", id="value-dialog.cancel")]

    DEFAULT_CSS = """
    ValueDialog {
        align: center middle;
    }
    ValueDialog > Vertical {
        width: 50;
        height: auto;
        padding: 1 2;
        border: thick $accent;
        background: $surface;
    }
    ValueDialog #error {
        color: $error;
        height: auto;
        min-height: 1;
    }
    ValueDialog #hint {
        color: $text-muted;
    }
    ValueDialog Horizontal {
        height: auto;
        margin-top: 1;
    }
    ValueDialog Button {
        width: 1fr;
    }
    """

    def __init__(self, title: str, what: str, hint: str, *, allow_off: bool = False,
                 current: str = "") -> None:
        super().__init__()
        self.title_text = title
        self.what = what
        self.hint = hint
        self.allow_off = allow_off
        self.current = current

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.title_text)
            yield Static(self.hint, id="hint")
            yield Input(value=self.current, placeholder="off" if self.allow_off else "", id="value")
            yield Static("", id="error")
            with Horizontal():
                yield Button("Apply", id="apply", variant="primary")
                yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        field = self.query_one(Input)
        field.focus()
        field.select_all()

    def on_input_changed(self) -> None:
        self.query_one("#error", Static).update("")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self._submit()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == "cancel":
            self.dismiss(None)
        else:
            self._submit()

    def _submit(self) -> None:
        text = self.query_one(Input).value
        try:
            value = parse_positive(text, self.what, allow_off=self.allow_off)
        except ValueError as exc:
            self.query_one("#error", Static).update(str(exc))
            return
        self.dismiss("off" if value is None else value)
