"""One-line glyph drawings: sparklines and bars, as plain Rich Text.

No Textual here; the Layers and System views place these in their cells and lines.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from rich.text import Text

SPARK = "▁▂▃▄▅▆▇█"
"""Eight heights of a sparkline cell, lowest first."""

_EIGHTHS = " ▏▎▍▌▋▊▉"


def sparkline(values: Sequence[float | None], width: int, style: str = "", log: bool = False) -> Text:
    """The last ``width`` values as one cell each, scaled between their own min and max.

    A missing or non-finite value draws a red ``×`` (that is where a NaN was). With
    ``log``, positive values are compared on a log scale (gradient norms span decades).
    Fewer values than ``width`` are right-aligned, so the newest is always at the end.
    """
    values = list(values)[-width:] if width > 0 else []
    scaled: list[float | None] = []
    for v in values:
        if v is None or not math.isfinite(v) or (log and v <= 0):
            scaled.append(None)
        else:
            scaled.append(math.log10(v) if log else v)
    finite = [v for v in scaled if v is not None]
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 0.0)
    out = Text(" " * (width - len(values)))
    top = len(SPARK) - 1
    cells = []
    for v in scaled:
        if v is None:
            cells.append(None)
        else:
            cells.append(SPARK[round((v - lo) / (hi - lo) * top) if hi > lo else top // 2])
    # Runs of plain cells go in as one span: 500 rows of sparklines stay cheap to build.
    run: list[str] = []
    for cell in cells:
        if cell is None:
            if run:
                out.append("".join(run), style)
                run = []
            out.append("×", "bold red")
        else:
            run.append(cell)
    if run:
        out.append("".join(run), style)
    return out


EMPTY = "░"
"""The unfilled part of a bar: a glyph of its own, so a bar reads without colour too."""


def bar(fraction: float | None, width: int, style: str = "green", empty: str = "grey37") -> Text:
    """A horizontal bar ``width`` cells wide filled to ``fraction`` (clamped to 0..1), in eighths."""
    fraction = min(1.0, max(0.0, fraction)) if fraction is not None and math.isfinite(fraction) else 0.0
    eighths = round(fraction * width * 8)
    if fraction > 0:
        eighths = max(1, eighths)  # a busy resource never reads as idle
    full, rest = divmod(eighths, 8)
    out = Text("█" * full, style)
    if rest:
        out.append(_EIGHTHS[rest], style)
    out.append(EMPTY * (width - full - (1 if rest else 0)), empty)
    return out


def stacked(parts: Sequence[tuple[float | None, str]], width: int, empty: str = "grey37") -> Text:
    """Adjacent bar segments (fraction of the whole, style) filling ``width`` cells left to right.

    Fractions are of the whole bar; their sum is clamped to 1. Segments are whole cells
    (eighths between colours read as noise), and one above zero gets at least one cell.
    """
    out = Text()
    used = 0
    total = 0.0
    for fraction, style in parts:
        if fraction is None or not math.isfinite(fraction) or fraction <= 0:
            continue
        total = min(1.0, total + fraction)
        cells = min(width - used, max(1, round(total * width) - used))
        if cells > 0:
            out.append("█" * cells, style)
            used += cells
    if used < width:
        out.append(EMPTY * (width - used), empty)
    return out
