"""The events pane's one line for the metrics read from the script's output. Pure.

The engine journals each printed metric it finds (its first value, the line it came from)
and each it leaves out, one event each: the doctor lists them (``ptdash doctor``), where a
wrong guess is seen. In the events pane they would crowd out what asks for attention (a
script that prints six metrics filled six of its ten lines), so they share one line per
run, rewritten as names come: ``printed metrics: 6 found (acc, loss, lr, ...); ptdash
doctor lists their lines``.
"""

from __future__ import annotations

from ptdash.shared import events

from .eventline import EventLine

NAMES_SHOWN = 4
"""Names the line spells out; the rest are counted."""


class PrintedLine:
    """Folds ``printed`` events into one EventLine (``line``, None before the first)."""

    def __init__(self) -> None:
        self.line: EventLine | None = None
        self._found: dict[str, None] = {}
        """The names found, in the order they were (a dict: ordered and without repeats, across ranks)."""
        self._left: dict[str, str] = {}
        """Name -> why it is left out."""

    def take(self, wall: float, step: int | None, what: events.PrintedMetric) -> EventLine | None:
        """Fold one in. The line when it is new (the pane adds it), None when the line that is
        shown already changed in place (or nothing changed)."""
        if what.left_out is not None:
            self._left.setdefault(what.name, what.left_out)
        else:
            self._found.setdefault(what.name, None)
        text = self.text()
        if self.line is None:
            self.line = EventLine(wall, step, text, "dim", "printed")
            return self.line
        self.line.text = text
        return None

    def text(self) -> str:
        """``printed metrics: 3 found (val_loss, acc, lr); 1 left out (loss: ptdash's loss); ...``."""
        found = [n for n in self._found if n not in self._left]
        parts = []
        if found:
            shown = ", ".join(found[:NAMES_SHOWN]) + (f", and {len(found) - NAMES_SHOWN} more"
                                                      if len(found) > NAMES_SHOWN else "")
            parts.append(f"{len(found)} found ({shown})")
        if self._left:
            said = [f"{n}: {why}" for n, why in list(self._left.items())[:2]]
            more = len(self._left) - len(said)
            parts.append(f"{len(self._left)} left out ({'; '.join(said)}{f'; and {more} more' if more else ''})")
        return "printed metrics: " + "; ".join(parts) + "; ptdash doctor lists each with its line"
