"""Rich renderables as plain text, for tests of what a tab draws without an app."""

from __future__ import annotations

from io import StringIO

from rich.console import Console


def text_of(renderable, width: int = 100) -> str:
    """What ``renderable`` prints on a console ``width`` columns wide, without colour."""
    console = Console(width=width, file=StringIO(), color_system=None, record=True)
    console.print(renderable)
    return console.export_text()
