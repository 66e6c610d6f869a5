"""Where the run is: every thread's stack of every rank, over the dashboard (``k``).

Opened by ``k`` on a live run (which asks the engine again) or on the stacks a stall kept; it
shows the newest the app has (``show``), scrolls, and closes with Escape. ``k`` here asks again.
"""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from ..tabs import stacks


class StacksScreen(ModalScreen[None]):
    """Shows one set of every rank's stacks: ``(when, RankStacks...)`` as ``RunState.stacks`` holds it."""

    BINDINGS = [
        Binding("escape,q", "dismiss(None)", "Close", id="stacks.close"),
        Binding("k", "app.stacks", "Ask again", id="stacks.again"),
    ]

    DEFAULT_CSS = """
    StacksScreen {
        align: center middle;
    }
    StacksScreen > Vertical {
        width: 96%;
        height: 94%;
        padding: 0 1;
        border: thick $accent;
        background: $surface;
    }
    StacksScreen #stacks-title {
        height: 1;
    }
    StacksScreen VerticalScroll {
        height: 1fr;
    }
    StacksScreen #stacks-hint {
        height: 1;
        color: $text-muted;
    }
    """

    def __init__(self, shown: tuple[str, tuple] | None, asking: bool = False, live: bool = True) -> None:
        super().__init__()
        self.shown = shown
        self.asking = asking
        """A new answer is on its way (``k`` was pressed): the title says so until it comes."""
        self.live = live
        """Whether ``k`` can ask the run again."""

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(id="stacks-title")
            with VerticalScroll(id="stacks-scroll"):
                yield Static(id="stacks-body")
            yield Static(stacks.hint(self.live), id="stacks-hint")

    def on_mount(self) -> None:
        self._draw()
        self.query_one(VerticalScroll).focus()  # the arrow keys and PgUp/PgDn scroll at once

    def show(self, shown: tuple[str, tuple] | None, asking: bool = False) -> None:
        """Draw ``shown`` (the newest stacks), or note that new ones were asked for."""
        self.shown, self.asking = shown, asking
        if self.is_mounted:
            self._draw()

    def on_resize(self) -> None:
        self._draw()

    def _draw(self) -> None:
        when, found = self.shown if self.shown is not None else ("", ())
        self.query_one("#stacks-title", Static).update(stacks.title(when or "", self.asking))
        if self.shown is None:
            body = Text("Asking the run where every thread is…", "dim")
        else:
            # The body's width: the screen's, less the box's border, padding and scroll bar.
            body = stacks.body(found, max(40, int(self.size.width * 0.96) - 8) if self.size.width else 100)
        self.query_one("#stacks-body", Static).update(body)


def stacks_screen(app) -> StacksScreen | None:
    """The stacks screen when it is open (anywhere in the app's screen stack), else None."""
    return next((s for s in reversed(app.screen_stack) if isinstance(s, StacksScreen)), None)
