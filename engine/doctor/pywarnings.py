"""The script's own Python warnings, each distinct one recorded once as a ``warning`` event.

``warnings.showwarning`` is wrapped (it runs only when a warning is shown, never per
step); python's own printing of the warning is left exactly as it was.
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import Callable

from ..shared import events
from .sources import short_path

log = logging.getLogger("ptdash.doctor")

MAX_WARNINGS = 50
"""Distinct Python warnings recorded per run; later ones are only counted."""


class PythonWarnings:
    """Turns shown warnings into events; keeps anomaly mode's forward traceback for the crash."""

    def __init__(self, event: Callable[..., None], hidden: Callable[[object, object], bool]) -> None:
        self._event = event
        self._hidden = hidden
        """``hidden(message, frame)``: True for a warning ptdash raised itself and keeps from the user."""
        self._lock = threading.Lock()
        self._seen: set[tuple[str, str]] = set()
        self.dropped = 0
        self.anomaly_trace = ""
        """The last 'Error detected in ...' warning of autograd's anomaly mode."""

    def wrap(self, original):
        watcher = self

        def showwarning(message, category, filename, lineno, file=None, line=None):
            if watcher._hidden(message, sys._getframe(1)):
                return None
            try:
                watcher._on_warning(message, category, filename, lineno)
            except Exception:
                log.exception("warning capture failed")
            return original(message, category, filename, lineno, file, line)

        showwarning.__wrapped__ = original
        return showwarning

    def _on_warning(self, message, category, filename, lineno) -> None:
        text = str(message)
        if "Error detected in" in text and "Traceback of forward call" in text:
            self.anomaly_trace = text
        with self._lock:
            if (category.__name__, text) in self._seen:
                return
            if len(self._seen) >= MAX_WARNINGS:
                self.dropped += 1
                return
            self._seen.add((category.__name__, text))
        source = f"{short_path(filename)}:{lineno}"
        first = (text.strip().splitlines() or [""])[0]
        self._event(events.Warned(origin="python", category=category.__name__, text=text[:2000], source=source),
                    f"{category.__name__}: {first} ({source})")
