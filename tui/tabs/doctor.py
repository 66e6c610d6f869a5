"""What the Doctor tab shows: the training doctor's findings, newest first, then every
anomaly of the run and what was done about it.

Pure (no Textual): ``report`` draws the findings ``findings.Findings`` folded and the rows
``incidents.Incidents`` folded (for this tab; ``ptdash doctor`` prints the same ones).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ..findings import Finding
from ..incidents import Incident

if TYPE_CHECKING:
    from ..state import RunState

SEVERITY_STYLES = {"error": "bold red", "warning": "bold yellow", "info": "bold cyan"}

EMPTY = "No findings: none of the doctor's checks fired."


# ------------------------------------------------------------------------ drawing


def _where(finding: Finding) -> str:
    parts = [f"step {finding.step}" if finding.step is not None else "", finding.source or "",
             f"in {finding.module}" if finding.module else ""]
    if len(finding.ranks) > 1 or finding.ranks != [0]:
        ranks = sorted(finding.ranks)
        parts.append(f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}")
    return ", ".join(p for p in parts if p)


def finding_body(finding: Finding) -> Group:
    """A finding: its severity-coloured id and what was seen (first line), then where, why and the fix."""
    style = SEVERITY_STYLES.get(finding.severity, "bold")
    what = finding.what.strip().splitlines()[0] if finding.what.strip() else ""
    lines: list[RenderableType] = [Text.assemble((finding.id, style), "  ", (what, "bold"))]
    where = _where(finding)
    if where:
        lines.append(Text(where, "dim"))
    for label, text in (("why", finding.why), ("fix", finding.fix)):
        if text:
            lines.append(Text.assemble((f"{label}: ", "bold dim" if label == "why" else "bold green"), text))
    return Group(*lines)


def incidents(rows: list[Incident]) -> RenderableType:
    """Every anomaly and what was done about it, in the order they happened: step, action, what."""
    grid = Table.grid(padding=(0, 1, 0, 0))
    grid.add_column(width=2, justify="right")
    grid.add_column(ratio=1)
    for row in rows:
        ranks = sorted(row.ranks)
        where = f"step {row.step}" if row.step is not None else "step ?"
        if len(ranks) > 1 or ranks != [0]:
            where += f", rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
        grid.add_row(Text("▲", "bold red"), Text.assemble((where, "bold"), "  ", (row.action, "bold yellow"),
                                                          "  ", row.what))
    noun = "anomaly" if len(rows) == 1 else "anomalies"
    return Group(Text(f" {len(rows)} {noun}, and what was done", "bold"), grid)


def report(state: RunState, width: int = 0) -> RenderableType:
    """The whole Doctor tab: every finding, newest first (or the empty state), then the anomalies."""
    # A stall the engine could not end (the run was killed while stalled) lasted until the run's end.
    found = state.findings.newest_first(state.info.ended if state.ended and state.info is not None else None)
    rows = state.incidents.rows
    if not found:
        empty = Text(f" {EMPTY}", "dim")
        return Group(empty, Text(""), incidents(rows)) if rows else empty
    counts = {s: sum(f.severity == s for f in found) for s in SEVERITY_STYLES}
    head = Text(f" {len(found)} finding{'s' if len(found) != 1 else ''}", "bold")
    for level, count in counts.items():
        if count:
            head.append(f"  {count} {level}", SEVERITY_STYLES[level].replace("bold ", ""))
    # A grid, so wrapped lines stay indented under the id rather than under the bullet.
    grid = Table.grid(padding=(0, 1, 0, 0))
    grid.add_column(width=2, justify="right")
    grid.add_column(ratio=1)
    for finding in found:
        grid.add_row()
        grid.add_row(Text("●", SEVERITY_STYLES.get(finding.severity, "bold")), finding_body(finding))
    return Group(head, grid, Text(""), incidents(rows)) if rows else Group(head, grid)


def versions(state: RunState) -> tuple:
    """A cheap fingerprint of what ``report`` reads, to skip unchanged redraws."""
    return state.findings.version, state.incidents.version, state.ended
