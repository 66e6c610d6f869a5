"""What the Metrics tab shows: every series of the run, filtered, paged, one small chart each.

Pure functions from RunState to names and Panels (no Textual), so the choice and order of
series, the filter and the paging are tested without an app. A series is one the engine
keeps by step (ptdash's own: ``loss``, ``grad/...``, ``time/...``; what the script
printed, ``printed/...``; what it gave ``ptdash.log``, ``user/...``) or a reading taken by
time (``host/...``, ``gpu<i>/...``, rank 0's), drawn against seconds since the first one.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from rich.text import Text

from ptdash.shared import names
from ptdash.shared.numbers import ema_series

from ..chart import Chart, Line
from ..fmt import fmt_num
from ..state import RunState
from .overview import PALETTE, Panel

GROUPS = ("script", "training", "time", "ptdash", "system")
"""The order of the grid: what the script printed or logged first (what it chose to show),
then ptdash's training series, its timings, its own cost, the machine's readings."""


def group_of(name: str) -> str:
    """Which of GROUPS series ``name`` belongs to."""
    if names.parse_printed(name) is not None or names.parse_user(name) is not None:
        return "script"
    if name.startswith(("time/", "throughput/")):
        return "time"
    if name.startswith("ptdash/"):
        return "ptdash"
    if name.startswith("host/") or names.parse_gpu(name) is not None:
        return "system"
    return "training"


def by_time(state: RunState, name: str) -> bool:
    """Whether ``name`` is a reading taken by time (rank 0's host and GPU samples)."""
    return name not in state.series and name in state.samples.get(0, {})


def series_names(state: RunState) -> list[str]:
    """Every series of the run with at least one point, grouped (GROUPS), by name within a group."""
    found = {n for n, s in state.series.items() if s.steps}
    found |= {n for n, s in state.samples.get(0, {}).items() if s.steps}
    return sorted(found, key=lambda n: (GROUPS.index(group_of(n)), n))


def compile_filter(text: str) -> re.Pattern | None:
    """The filter typed after ``/`` (a regular expression, case-insensitive, searched anywhere
    in the name); None for an empty one. Raises ValueError with a one-line reason for a bad one."""
    if not text.strip():
        return None
    try:
        return re.compile(text.strip(), re.IGNORECASE)
    except re.error as exc:
        raise ValueError(f"not a regular expression: {exc}") from None


def matching(all_names: list[str], pattern: re.Pattern | None) -> list[str]:
    """The names the filter keeps, in their order."""
    return list(all_names) if pattern is None else [n for n in all_names if pattern.search(n)]


class Page(NamedTuple):
    """The names on one page of the grid, which page it is, of how many."""

    names: list[str]
    index: int
    count: int


def page(shown: list[str], index: int, per_page: int) -> Page:
    """Page ``index`` (clamped to the pages there are) of ``shown``, ``per_page`` charts a page."""
    per_page = max(1, per_page)
    count = max(1, -(-len(shown) // per_page))
    index = min(max(0, index), count - 1)
    return Page(shown[index * per_page:(index + 1) * per_page], index, count)


def points(state: RunState, name: str) -> tuple[list, list]:
    """The x (steps, or seconds since the first reading) and values of series ``name``."""
    series = state.series.get(name)
    if series is None:
        series = state.samples.get(0, {}).get(name)
        if series is None or not series.steps:
            return [], []
        start = series.steps[0]
        return [w - start for w in series.steps], list(series.values)
    return series.steps, series.values


def panel(state: RunState, name: str, colour_index: int = 0, smoothing: float = 0.0) -> Panel:
    """Series ``name`` as one chart: its newest value (and its range) in the legend; a by-time
    reading says so in the note. ``smoothing``: the EMA drawn over the raw line (0: none)."""
    xs, values = points(state, name)
    style = PALETTE[colour_index % len(PALETTE)]
    if not xs:
        return Panel(Text("no points", "dim"), Chart())
    lines = [Line(xs, values, f"dim {style}" if smoothing else style)]
    if smoothing and not by_time(state, name):
        lines.append(Line(xs, ema_series(values, 1 - smoothing, xs), style))
    finite = [v for v in values if v is not None]
    latest = values[-1]
    legend = Text.assemble((fmt_num(latest, 4) if latest is not None else "non-finite", f"bold {style}"))
    if finite:
        legend.append(f"  {fmt_num(min(finite), 3)}..{fmt_num(max(finite), 3)}", "dim")
    note = Text("by time (s)" if by_time(state, name) else f"step {xs[-1]:,}", "dim")
    return Panel(legend, Chart(lines, "auto"), note)


def versions(state: RunState, shown: list[str]) -> tuple:
    """A cheap fingerprint of the series on a page, to skip redraws of unchanged data."""
    out = []
    for name in shown:
        series = state.series.get(name) or state.samples.get(0, {}).get(name)
        out.append(series.version if series is not None else -1)
    return tuple(out)


def pinned_reads(state: RunState, pinned: str | None) -> tuple[str, ...]:
    """What the Overview's pinned chart reads: the series pinned from the Metrics tab, if any."""
    return (pinned,) if pinned else ()


def pinned(state: RunState, pinned_name: str | None, smoothing: float = 0.0) -> Panel:
    """The Overview's pinned chart: the pinned series as the Metrics tab draws it, titled by its name."""
    if not pinned_name:
        return Panel(Text(), Chart())
    drawn = panel(state, pinned_name, 4, smoothing)
    return Panel(Text.assemble((pinned_name, "bold"), "  ", drawn.legend), drawn.chart,
                 Text("7, * unpins", "dim"))
