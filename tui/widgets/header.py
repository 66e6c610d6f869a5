"""The one-line run status bar: name, state, step, speed, time, controls in effect."""

from __future__ import annotations

import time

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from ptdash.shared.exits import describe_exit
from ptdash.shared.protocol import ENDED, Status

from ..fmt import eta, fmt_duration, fmt_num, fmt_si

STATE_STYLES = {
    "starting": "bold cyan", "running": "bold green", "pausing": "bold yellow",
    "paused": "bold black on yellow", "stopping": "bold yellow", "finished": "bold green",
    "stopped": "bold yellow", "crashed": "bold white on red",
}


def state_text(status: Status | None) -> str:
    """How a state reads: ``running``, ``paused at step 540``, ``crashed (killed by SIGKILL)``."""
    if status is None:
        return "starting"
    state = status.state
    if state == "paused":
        return f"paused at step {status.paused_at if status.paused_at is not None else status.step}"
    if state in ("pausing", "stopping"):
        return f"{state}…"
    if state in ("finished", "crashed") and status.exit_code is not None:
        return f"{state} ({describe_exit(status.exit_code)})"
    return state


class RunHeader(Widget):
    """Shows the run's state; the app sets the attributes, the header only draws.

    Pieces that do not fit the width are dropped, least important first.
    """

    DEFAULT_CSS = """
    RunHeader {
        height: 1;
        background: $panel;
    }
    """

    run_name: reactive[str] = reactive("", layout=False)
    """The run's name (script or --name)."""

    status: reactive[Status | None] = reactive(None, layout=False)
    """The latest Status from the engine or the run dir."""

    steps_per_s: reactive[float | None] = reactive(None, layout=False)
    """Recent optimizer steps per second, over running time."""

    total_steps: reactive[int | None] = reactive(None, layout=False)
    """The step the run ends at, when known (a scheduler's length, ``--steps``)."""

    epoch: reactive[int | None] = reactive(None, layout=False)
    """The training loop's epoch, when the engine counts it."""

    started: reactive[float | None] = reactive(None, layout=False)
    """Wall time the run started (for elapsed time)."""

    ended: reactive[float | None] = reactive(None, layout=False)
    """Wall time the run ended, or of its last step when it is not live."""

    connection: reactive[str] = reactive("connecting…", layout=False)
    """A short note on the link to the engine; shown unless it is simply live."""

    pause_reason: reactive[str | None] = reactive(None, layout=False)
    """Why the engine paused the run by itself (an anomaly); shown while it is paused."""

    def on_mount(self) -> None:
        # Elapsed time and ETA move on their own; one redraw a second while the run is live.
        self._clock = self.set_interval(1.0, self.refresh)

    def watch_status(self, status: Status | None) -> None:
        clock = getattr(self, "_clock", None)
        if clock is not None and status is not None and status.state in ENDED:
            clock.pause()

    def render(self) -> Text:
        return fit(self.pieces(time.time()), self.size.width)

    def pieces(self, now: float) -> list[tuple[int, Text]]:
        """(priority, text) in display order; a lower priority is dropped first."""
        status = self.status
        out: list[tuple[int, Text]] = [(5, Text(f" {self.run_name} ", "bold reverse"))]
        out.append((9, Text(f" {state_text(status)} ", STATE_STYLES.get(status.state if status else "starting", ""))))
        if self.pause_reason and status is not None and status.state == "paused":
            out.append((8, Text(self.pause_reason, "bold red")))
        if status is not None:
            total = f"/{self.total_steps:,}" if self.total_steps else ""
            out.append((8, Text.assemble(("step ", "dim"), (f"{status.step:,}{total}", "bold"))))
        if self.epoch is not None:
            out.append((6, Text.assemble(("epoch ", "dim"), (f"{self.epoch:,}", "bold"))))
        if self.steps_per_s is not None and status is not None and status.state in ("running", "pausing", "stopping"):
            out.append((5, Text.assemble((f"{fmt_si(self.steps_per_s)}", "bold"), (" it/s", "dim"))))
        if self.started is not None:
            end = self.ended if (status and status.state in ENDED and self.ended) else now
            out.append((3, Text.assemble(("elapsed ", "dim"), fmt_duration(end - self.started))))
        if status is not None and status.state in ("running", "starting"):
            left = eta(status.step, self.total_steps, self.steps_per_s)
            if left is not None:
                out.append((4, Text.assemble(("ETA ", "dim"), fmt_duration(left))))
        if status is not None and status.clip is not None:
            out.append((6, Text.assemble(("clip ", "dim"), (fmt_num(status.clip), "bold yellow"))))
        if status is not None and status.lr_scale != 1.0:
            out.append((6, Text.assemble(("LR ×", "dim"), (fmt_num(status.lr_scale), "bold yellow"))))
        if self.connection and self.connection != "live":
            out.append((7, Text(self.connection, "italic red" if "disconnected" in self.connection else "italic")))
        return out


def fit(pieces: list[tuple[int, Text]], width: int) -> Text:
    """Join pieces with separators, dropping the least important until the line fits."""
    pieces = list(pieces)
    while True:
        line = Text(" │ ", "dim").join(text for _, text in pieces)
        if line.cell_len <= width or len(pieces) <= 1:
            line.truncate(width, overflow="ellipsis")
            return line
        drop = min(range(len(pieces)), key=lambda i: (pieces[i][0], -i))
        pieces.pop(drop)
