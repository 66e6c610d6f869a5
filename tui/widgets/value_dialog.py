"""Asks for one live setting (clip norm, LR factor), refusing bad input in place."""

from __future__ import annotations

from dataclasses import dataclass

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

from ptdash.shared.limits import parse_setting

from ..fmt import fmt_typed

CONFIRM_RATIO = 10.0
"""A new value this many times above or below the current one asks for a second Enter."""


@dataclass(frozen=True)
class Typed:
    """The dialog's answer: the value (None turns the clip off) and the text it was typed as,
    which is how the events pane shows it."""

    value: float | None
    text: str


class ValueDialog(ModalScreen[Typed | None]):
    """Dismisses with a ``Typed`` value of ``setting`` (``clip`` or ``lr_scale``), or None (cancel).

    Input is checked with ``limits.parse_setting``, the engine's own ranges; an error is
    shown under the field and nothing is returned until the input is valid. An empty box
    cancels, so turning the clip off takes typing ``off``. A value more than CONFIRM_RATIO
    times away from ``reference`` (the value in force) is applied only on a second Enter.
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

    def __init__(self, title: str, setting: str, hint: str, *, current: str = "",
                 reference: float | None = None) -> None:
        super().__init__()
        self.title_text = title
        self.setting = setting
        self.hint = hint
        self.current = current
        self.reference = reference
        self._confirming: str | None = None
        """The text whose large change was questioned: Enter on it again applies it."""

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.title_text)
            yield Static(self.hint, id="hint")
            yield Input(value=self.current, placeholder="off" if self.setting == "clip" else "", id="value")
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
        text = self.query_one(Input).value.strip()
        if not text:
            self.dismiss(None)
            return
        try:
            value = parse_setting(self.setting, text)
        except ValueError as exc:
            self.query_one("#error", Static).update(str(exc))
            return
        question = self._question(value, text)
        if question and self._confirming != text:
            self._confirming = text
            self.query_one("#error", Static).update(question)
            return
        self.dismiss(Typed(value, text))

    def _question(self, value: float | None, text: str) -> str | None:
        """What to ask before a change of more than CONFIRM_RATIO times, or None."""
        if value is None or not self.reference or self.reference <= 0:
            return None
        ratio = value / self.reference
        if 1 / CONFIRM_RATIO <= ratio <= CONFIRM_RATIO:
            return None
        factor, way = (ratio, "above") if ratio > 1 else (1 / ratio, "below")
        return (f"{text} is {factor:,.3g}x {way} the current {fmt_typed(self.reference)}: "
                "Enter again applies it, Escape cancels")
