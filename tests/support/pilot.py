"""Helpers for Pilot tests: read the screen as text, and wait for a condition."""

from __future__ import annotations

import time
from io import StringIO

from rich.console import Console


def screen_text(app) -> str:
    """The characters on screen now (what export_screenshot draws, as plain text)."""
    console = Console(width=app.size.width, height=app.size.height, file=StringIO(),
                      record=True, color_system=None, legacy_windows=False)
    # The compositor is private; it is what App.export_screenshot renders too.
    console.print(app.screen._compositor.render_update(full=True))
    return console.export_text()


async def until(pilot, condition, timeout: float = 60.0, what: str = "") -> None:
    """Let the app run until ``condition()`` holds (fails the test after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or condition}\n{screen_text(pilot.app)}")
        await pilot.pause(0.05)
