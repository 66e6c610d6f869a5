"""Textual messages of the dashboard, all in one place (toolong style)."""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message


@dataclass
class SourceUpdate(Message):
    """The source delivered something; the app drains its inbox when this arrives.

    Deliveries themselves wait in the app's inbox, so a burst of them costs one message:
    a queued SourceUpdate is replaced by the next instead of piling up.
    """

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, SourceUpdate)
