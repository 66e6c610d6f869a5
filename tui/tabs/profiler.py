"""What the Profiler tab shows: the latest profile report, or the one being recorded.

Pure functions from RunState to Rich renderables (no Textual), tested without an app.
The report is the engine's ``profile`` event (``events.Profile``): ``steps`` (A, B), ``device``,
``trace`` (a Chrome trace file), ``top`` (the most expensive ops), and ``error`` on failure.
"""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ptdash.shared.events import TopOp

from ..fmt import fmt_bytes
from ..state import RunState


def _ms(value) -> str:
    return f"{value:.2f}" if isinstance(value, (int, float)) else "N/A"


def top_ops(top: tuple[TopOp, ...], device: str) -> Table:
    """The top-ops table: name, calls, self/total CPU ms, device ms and memory."""
    cuda = device == "cuda"
    table = Table(box=None, padding=(0, 1), header_style="bold", expand=True)
    table.add_column("op", ratio=1, no_wrap=True, overflow="ellipsis")
    table.add_column("calls", justify="right")
    table.add_column("self ms", justify="right")
    table.add_column("total ms", justify="right")
    if cuda:
        table.add_column("self dev ms", justify="right")
        table.add_column("total dev ms", justify="right")
    table.add_column("dev mem" if cuda else "cpu mem", justify="right")
    for op in top:
        row = [op.name, str(op.calls) if op.calls is not None else "N/A", _ms(op.self_ms), _ms(op.total_ms)]
        if cuda:
            row += [_ms(op.self_device_ms), _ms(op.total_device_ms)]
        mem = op.device_mem_bytes if cuda else op.cpu_mem_bytes
        row.append(fmt_bytes(mem) if mem is not None else "N/A")
        table.add_row(*row)
    return table


def report(state: RunState, width: int = 0) -> RenderableType:
    """The whole Profiler tab (its table takes whatever ``width`` the console gives)."""
    parts: list[RenderableType] = []
    if state.profile_pending:
        pending = state.profile_pending
        if state.ended:
            pending = pending.rstrip("…") + ": the run ended before the report"
        parts.append(Text(f" {pending}", "bold yellow"))
    if state.profile_note:
        parts.append(Text(f" {state.profile_note}", "bold red"))
    profile = state.profile
    if profile is None:
        if not parts:
            parts.append(Text(" no profile yet: press p to profile the next steps", "dim"))
        return Group(*parts)
    a, b = (*profile.steps, "?", "?")[:2]
    head = Text.assemble((f" steps {a}-{b}", "bold"), ("  device ", "dim"), profile.device or "N/A")
    parts.append(head)
    if profile.error:
        parts.append(Text(f" profile failed: {profile.error}", "bold red"))
    if profile.trace:
        parts.append(Text.assemble((" trace ", "dim"), (profile.trace, "bold")))
        parts.append(Text(" open it in Perfetto (ui.perfetto.dev) or Holistic Trace Analysis", "dim"))
    if profile.top:
        parts.append(Text(""))
        parts.append(top_ops(profile.top, profile.device or "cpu"))
    elif not profile.error:
        parts.append(Text(" the profiler recorded no ops", "dim"))
    return Group(*parts)


def versions(state: RunState) -> tuple:
    """A cheap fingerprint of everything ``report`` reads, to skip unchanged redraws."""
    return id(state.profile), state.profile_pending, state.profile_note, state.ended
