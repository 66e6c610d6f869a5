"""Collects what a dashboard source posts from its own thread, for tests to wait on."""

from __future__ import annotations

import threading
import time


class Inbox:
    """Collects what a source posts, from its thread."""

    def __init__(self) -> None:
        self.items: list = []
        self._cond = threading.Condition()

    def __call__(self, obj) -> None:
        with self._cond:
            self.items.append(obj)
            self._cond.notify_all()

    def wait(self, predicate, timeout: float = 60.0):
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                found = [x for x in self.items if predicate(x)]
                if found:
                    return found[-1]
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"nothing matched; got {[type(x).__name__ for x in self.items]}")
                self._cond.wait(left)
