"""Shown when the run runs out of memory: the error, what to try, the allocator's summary."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from ptdash.shared.events import Oom


class OomScreen(ModalScreen[None]):
    """Shows one ``oom`` event's data; any listed close key dismisses."""

    BINDINGS = [Binding("escape,q,enter", "dismiss(None)", "Close", id="oom.close")]

    DEFAULT_CSS = """
    OomScreen {
        align: center middle;
    }
    OomScreen > Vertical {
        width: 90%;
        max-width: 110;
        height: 90%;
        padding: 0 1;
        border: thick $error;
        background: $surface;
    }
    OomScreen #oom-title {
        color: $error;
        text-style: bold;
    }
    OomScreen VerticalScroll {
        height: 1fr;
    }
    OomScreen #oom-summary {
        color: $text-muted;
        margin-top: 1;
    }
    """

    def __init__(self, report: Oom) -> None:
        super().__init__()
        self.report = report

    def compose(self) -> ComposeResult:
        report = self.report
        remedies = Text()
        for i, remedy in enumerate(report.remedies, 1):
            remedies.append(f"{i}. ", "bold")
            remedies.append(f"{remedy}\n")
        with Vertical():
            yield Static("Out of memory", id="oom-title")
            with VerticalScroll():
                yield Static(Text(report.error or "CUDA out of memory", "red"), id="oom-error")
                yield Static(Text("\nWhat to try:", "bold"))
                yield Static(remedies, id="oom-remedies")
                if report.snapshot:
                    yield Static(Text(f"Memory snapshot: {report.snapshot} (open it at pytorch.org/memory_viz)"))
                summary = report.memory_summary
                yield Static(Text(summary if summary else "no allocator summary (CUDA was not in use)"),
                             id="oom-summary")
            yield Static(Text("Esc closes; the System tab keeps the remedies.", "dim"))
