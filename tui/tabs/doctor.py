"""What the Doctor tab shows: the training doctor's findings, newest first.

The engine raises each finding once, as an Event of kind ``finding`` whose data holds a
stable rule ``id``, ``what`` was seen, ``why`` it matters, the ``fix`` and its ``severity``
(and maybe ``step``, ``module``, ``source``, ``case``). Under DDP every rank may raise the
same one; it is shown once, naming the ranks. Pure (no Textual): ``Findings`` folds
events (for this tab and for ``ptdash doctor``), ``report`` draws them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ptdash.shared.protocol import Event

if TYPE_CHECKING:
    from ..state import RunState

SEVERITY_STYLES = {"error": "bold red", "warning": "bold yellow", "info": "bold cyan"}

EMPTY = "No findings: none of the doctor's checks fired."

@dataclass
class Finding:
    """One doctor finding, as the Doctor tab lists it."""

    id: str
    what: str
    why: str
    fix: str
    severity: str
    step: int | None = None
    wall: float = 0.0
    case: str | None = None
    source: str | None = None
    module: str | None = None
    ranks: list[int] = field(default_factory=list)


def severity(data: dict) -> str:
    """The severity the engine's catalogue gave the finding (``warning`` when it gave none)."""
    given = data.get("severity")
    return given if given in SEVERITY_STYLES else "warning"


class Findings:
    """The findings seen so far, one per rule (and case), in the order they were raised."""

    def __init__(self) -> None:
        self._by_key: dict[tuple, Finding] = {}
        self.version = 0
        """Bumped on every change, so the tab redraws only when something was found."""

    def __len__(self) -> int:
        return len(self._by_key)

    def add(self, event: Event) -> Finding | None:
        """Fold one ``finding`` event in; the Finding when it is new, None for a repeat."""
        message, data, step, wall, rank = event.message, event.data, event.step, event.wall, event.rank
        rule = str(data.get("id") or (message or "?").partition(":")[0])
        case = data.get("case")
        key = (rule, case)
        found = self._by_key.get(key)
        if found is not None:
            if rank not in found.ranks:
                found.ranks.append(rank)
                self.version += 1
            return None
        what = str(data.get("what") or (message or "").partition(": ")[2] or message or "")
        at = data.get("step", step)
        found = self._by_key[key] = Finding(
            id=rule, what=what, why=str(data.get("why") or ""), fix=str(data.get("fix") or ""),
            severity=severity(data), step=at if isinstance(at, int) else None, wall=wall,
            case=case if isinstance(case, str) else None,
            source=str(data["source"]) if data.get("source") else None,
            module=str(data["module"]) if data.get("module") else None, ranks=[rank])
        self.version += 1
        return found

    def newest_first(self) -> list[Finding]:
        return list(self._by_key.values())[::-1]

    def worst(self) -> str:
        """The highest severity found (``info`` when nothing was)."""
        found = {f.severity for f in self._by_key.values()}
        return next((s for s in SEVERITY_STYLES if s in found), "info")


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


def report(state: RunState, width: int = 0) -> RenderableType:
    """The whole Doctor tab: every finding, newest first, or the empty state."""
    found = state.findings.newest_first()
    if not found:
        return Text(f" {EMPTY}", "dim")
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
    return Group(head, grid)


def versions(state: RunState) -> int:
    """A cheap fingerprint of what ``report`` reads, to skip unchanged redraws."""
    return state.findings.version
