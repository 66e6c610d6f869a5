"""The training doctor's findings as the dashboard and ``ptdash doctor`` fold them.

The engine raises each finding once, as an event whose data is an ``events.Finding``: a
stable rule ``id``, ``what`` was seen, ``why`` it matters, the ``fix`` and its ``severity``
(and maybe ``step``, ``module``, ``source``, ``case``). Under DDP every rank may raise the
same one; it is kept once, naming the ranks. Pure: no Textual, no Rich.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ptdash.shared import events
from ptdash.shared.protocol import Event

SEVERITIES = ("error", "warning", "info")
"""Every severity, the worst first."""


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


def severity(found: events.Finding) -> str:
    """The severity the engine's catalogue gave the finding (``warning`` when it gave none)."""
    return found.severity if found.severity in SEVERITIES else "warning"


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
        found = events.read(event)
        if not isinstance(found, events.Finding):
            return None
        message, rank = event.message or "", event.rank
        rule = found.id or message.partition(":")[0] or "?"
        key = (rule, found.case)
        known = self._by_key.get(key)
        if known is not None:
            if rank not in known.ranks:
                known.ranks.append(rank)
                self.version += 1
            return None
        known = self._by_key[key] = Finding(
            id=rule, what=found.what or message.partition(": ")[2] or message, why=found.why, fix=found.fix,
            severity=severity(found), step=found.step if found.step is not None else event.step, wall=event.wall,
            case=found.case, source=found.source or None, module=found.module or None, ranks=[rank])
        self.version += 1
        return known

    def newest_first(self) -> list[Finding]:
        return list(self._by_key.values())[::-1]

    def worst(self) -> str:
        """The highest severity found (``info`` when nothing was)."""
        found = {f.severity for f in self._by_key.values()}
        return next((s for s in SEVERITIES if s in found), "info")
