"""The training doctor's findings as the dashboard and ``ptdash doctor`` fold them.

The engine raises each finding once, as an event whose data is an ``events.Finding``: a
stable rule ``id``, ``what`` was seen, ``why`` it matters, the ``fix`` and its ``severity``
(and maybe ``step``, ``module``, ``source``, ``case``). Under DDP every rank may raise the
same one; it is kept once, naming the ranks. Pure: no Textual, no Rich.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from ptdash.shared import events, stacks
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
    extra: dict = field(default_factory=dict)
    """The rule's own details (a stall's ``seconds`` and whether it is ``over``)."""


def severity(found: events.Finding) -> str:
    """The severity the engine's catalogue gave the finding (``warning`` when it gave none)."""
    return found.severity if found.severity in SEVERITIES else "warning"


class Findings:
    """The findings seen so far, one per rule (and case), in the order they were raised."""

    def __init__(self) -> None:
        self._by_key: dict[tuple, Finding] = {}
        self._stalls: dict[str, events.Stall] = {}
        """A stall's case (``step 29``) -> its ``stall`` event, whose stacks say where the ranks were."""
        self.version = 0
        """Bumped on every change, so the tab redraws only when something was found."""

    def __len__(self) -> int:
        return len(self._by_key)

    def add(self, event: Event) -> Finding | None:
        """Fold one ``finding`` event in; the Finding when it is new, None for a repeat."""
        found = events.read(event)
        if isinstance(found, events.Stall) and not found.ended and found.step is not None:
            self._stalls[f"step {found.step}"] = found
        if not isinstance(found, events.Finding):
            return None
        message, rank = event.message or "", event.rank
        rule = found.id or message.partition(":")[0] or "?"
        key = (rule, found.case)
        what = found.what or message.partition(": ")[2] or message
        known = self._by_key.get(key)
        if known is not None:
            if rank not in known.ranks:
                known.ranks.append(rank)
                self.version += 1
            elif (what, found.extra) != (known.what, known.extra):  # raised again by its rank: newer words
                known.what, known.extra = what, found.extra  # (a stall's whole length, once it is over)
                self.version += 1
            return None
        known = self._by_key[key] = Finding(
            id=rule, what=what, why=found.why, fix=found.fix,
            severity=severity(found), step=found.step if found.step is not None else event.step, wall=event.wall,
            case=found.case, source=found.source or None, module=found.module or None, ranks=[rank],
            extra=found.extra)
        self.version += 1
        return known

    def newest_first(self, ended_at: float | None = None, live: bool = False) -> list[Finding]:
        """The findings, newest first. A stall the engine could not say the end of (the run was
        killed while stalled) lasted until the run's end (``ended_at``); one still going on
        (``live``) has lasted until now."""
        found = list(self._by_key.values())[::-1]
        if ended_at is None and not live:
            return found
        return [self._lasting(f, ended_at, live) if f.id == "stalled" else f for f in found]

    def _lasting(self, finding: Finding, ended_at: float | None, live: bool) -> Finding:
        stall = self._stalls.get(finding.case or "")
        if finding.extra.get("over") is not False or stall is None or stall.started is None or not stall.stacks:
            return finding  # over (or from an engine that did not say): its words are the engine's
        if live:
            seconds = time.time() - stall.started
            return replace(finding, what=stacks.summary(list(stall.stacks), seconds, so_far=True),
                           extra={**finding.extra, "seconds": round(seconds, 3)})
        seconds = max(0.0, ended_at - stall.started)
        return replace(finding, what=f"{stacks.summary(list(stall.stacks), seconds)}; the run ended while stalled",
                       extra={**finding.extra, "seconds": round(seconds, 3), "over": True, "with_run": True})

    def worst(self) -> str:
        """The highest severity found (``info`` when nothing was)."""
        found = {f.severity for f in self._by_key.values()}
        return next((s for s in SEVERITIES if s in found), "info")
