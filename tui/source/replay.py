"""A finished run's files, read-only: ``ReplaySource``, for ``ptdash show``, screenshots and tests."""

from __future__ import annotations

import threading
from pathlib import Path

from . import Connection, LogLines, Post, Source
from .history import load_history, load_series
from .logtail import LogTail


class ReplaySource(Source):
    """A run's history only: delivers it once, with output.log's tail, and never controls."""

    can_control = False

    def __init__(self, run_dir: Path | str) -> None:
        super().__init__(run_dir)
        self._thread: threading.Thread | None = None

    def start(self, post: Post) -> None:
        self._thread = threading.Thread(target=self._run, args=(post,), name="ptdash-replay", daemon=True)
        self._thread.start()

    def _run(self, post: Post) -> None:
        history = load_history(self.run_dir)
        post(history)
        if history.pending:
            post(load_series(self.run_dir, history.pending))
        tail = LogTail(self.run_dir / "output.log")
        lines = tail.read()
        if lines:
            post(LogLines(lines))
        post(Connection(False, "replay (read-only)"))

    def close(self) -> None:
        if self._thread is not None:
            self._thread.join(timeout=2)
