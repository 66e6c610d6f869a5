"""Every anomaly of a run and what was done about it: each rollback, skip, pause and warning.

``show --once``, ``ptdash doctor`` and the Doctor tab list the same rows, folded here from
the run's ``anomaly`` and ``rollback`` events: the step that was bad, what was seen, and the
action (``paused``, ``skipped``, ``rolled back to step 134, 16 batches skipped``,
``reported``). An event raised by several ranks of a DDP run for the same step and words is
one row naming its ranks; the LR factor coming back after a rollback is not a row of its
own (its rollback's row says it was lowered). Pure: no Textual, no Rich.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ptdash.shared import events
from ptdash.shared.protocol import Event

ACTIONS = {"pause": "paused", "skip": "skipped", "warn": "reported", "rollback": "rolled back", "stop": "stopped"}
"""``--on-anomaly``'s words as the listing says them."""


@dataclass
class Incident:
    """One row: at ``step``, ``what`` was seen (the event's sentence), and the ``action`` taken."""

    step: int | None
    what: str
    action: str
    kind: str
    """The event's kind: ``anomaly`` or ``rollback``."""
    wall: float = 0.0
    ranks: list[int] = field(default_factory=list)

    def to_data(self) -> dict:
        """The row as JSON (``show --once --json``, ``ptdash doctor --json``)."""
        return {"step": self.step, "what": self.what, "action": self.action, "kind": self.kind,
                "ranks": sorted(self.ranks)}


def incident(event: Event, what: events.EventData | None = None) -> Incident | None:
    """The row of one event (``what``: what it says, when read already); None for an event
    that is not an anomaly or a rollback (or is the LR factor restored after one)."""
    what = events.read(event) if what is None else what
    if isinstance(what, events.Anomaly):
        step = what.step if what.step is not None else event.step
        return Incident(step, event.message, ACTIONS.get(what.action or "", "reported"), event.kind, event.wall,
                        [event.rank])
    if not isinstance(what, events.Rollback):
        return None
    if what.limit is not None:
        return Incident(what.step if what.step is not None else event.step, event.message,
                        ACTIONS.get(what.action or "", what.action or "reported"), event.kind, event.wall, [event.rank])
    if what.to_step is None and what.from_step is None:
        return None  # the LR factor back after a rollback: its rollback's row says it was lowered
    step = what.from_step if what.from_step is not None else what.step
    if what.to_step is not None:
        n = what.skipped
        action = f"rolled back to step {what.to_step}" + (
            f", {n} batch{'es' if n != 1 else ''} skipped" if n is not None else "")
    else:
        action = "skipped"  # no snapshot to go back to: the update alone was dropped
    return Incident(step, event.message, action, event.kind, event.wall, [event.rank])


class Incidents:
    """The rows so far, in the order they happened (``rows``); ``version`` bumps on a change."""

    def __init__(self) -> None:
        self.rows: list[Incident] = []
        self._by_key: dict[tuple, Incident] = {}
        self.version = 0

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, event: Event, what: events.EventData | None = None) -> Incident | None:
        """Fold one event in (``what``: what it says, when read already); the row when it is new."""
        if event.kind not in ("anomaly", "rollback"):
            return None
        row = incident(event, what)
        if row is None:
            return None
        key = (row.kind, row.step, row.what)
        known = self._by_key.get(key)
        if known is not None:  # another rank's word for the same step
            if event.rank not in known.ranks:
                known.ranks.append(event.rank)
                self.version += 1
            return None
        self._by_key[key] = row
        self.rows.append(row)
        self.version += 1
        return row


def listing(rows: list[Incident]) -> list[str]:
    """One plain line a row: ``step 150 (rolled back to step 134, 16 batches skipped): loss spike ...``."""
    out = []
    for row in rows:
        ranks = sorted(row.ranks)
        where = f"step {row.step}" if row.step is not None else "step ?"
        if len(ranks) > 1 or ranks != [0]:
            where += f" (rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))})"
        out.append(f"{where} ({row.action}): {row.what}")
    return out
