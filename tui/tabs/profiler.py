"""What the Profiler tab shows: the latest profile report, or the one being recorded.

Pure functions from RunState to Rich renderables (no Textual), tested without an app.
The report is the data of the engine's ``profile`` event: ``steps`` [A, B], ``device``,
``trace`` (a Chrome trace file), ``top`` (the most expensive ops), and ``error`` on failure.
"""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ..fmt import fmt_bytes
from ..state import RunState


def _ms(value) -> str:
    return f"{value:.2f}" if isinstance(value, (int, float)) else "N/A"


def top_ops(top: list[dict], device: str) -> Table:
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
        if not isinstance(op, dict):
            continue
        row = [str(op.get("name", "?")), str(op.get("calls", "N/A")), _ms(op.get("self_ms")), _ms(op.get("total_ms"))]
        if cuda:
            row += [_ms(op.get("self_device_ms")), _ms(op.get("total_device_ms"))]
        mem = op.get("device_mem_bytes" if cuda else "cpu_mem_bytes")
        row.append(fmt_bytes(mem) if isinstance(mem, (int, float)) else "N/A")
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
    data = state.profile
    if not data:
        if not parts:
            parts.append(Text(" no profile yet: press p to profile the next steps", "dim"))
        return Group(*parts)
    steps = data.get("steps") or ["?", "?"]
    a, b = (steps + ["?", "?"])[:2] if isinstance(steps, list) else ("?", "?")
    head = Text.assemble((f" steps {a}-{b}", "bold"), ("  device ", "dim"), str(data.get("device") or "N/A"))
    parts.append(head)
    if data.get("error"):
        parts.append(Text(f" profile failed: {data['error']}", "bold red"))
    if data.get("trace"):
        parts.append(Text.assemble((" trace ", "dim"), (str(data["trace"]), "bold")))
        parts.append(Text(" open it in Perfetto (ui.perfetto.dev) or Holistic Trace Analysis", "dim"))
    top = data.get("top") or []
    if top:
        parts.append(Text(""))
        parts.append(top_ops(top, str(data.get("device") or "cpu")))
    elif not data.get("error"):
        parts.append(Text(" the profiler recorded no ops", "dim"))
    return Group(*parts)


def versions(state: RunState) -> tuple:
    """A cheap fingerprint of everything ``report`` reads, to skip unchanged redraws."""
    return id(state.profile), state.profile_pending, state.profile_note, state.ended
