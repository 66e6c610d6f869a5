"""A braille line chart as a plain Rich renderable, tested without an app.

Each terminal cell holds a 2x4 braille dot matrix, so a 60x10 cell plot has 120x40
pixels. Points are bucketed by pixel column before anything is drawn (each column keeps
its min, max, first and last pixel row), so drawing 100k points costs one pass over
them and a few hundred line segments.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

from rich.console import Console, ConsoleOptions, RenderResult
from rich.segment import Segment
from rich.style import Style

from .fmt import fmt_si

BRAILLE_BASE = 0x2800
# Dot bit for pixel (x, y) inside a cell, y counted from the top.
_DOTS = ((0x01, 0x08), (0x02, 0x10), (0x04, 0x20), (0x40, 0x80))

AXIS_STYLE = Style(color="bright_black")


@dataclass
class Line:
    """One series to draw: its points, colour and whether it is dashed."""

    steps: list[int]
    values: list[float | None]
    style: Style | str = "white"
    dashed: bool = False

    def __post_init__(self) -> None:
        # A snapshot: the series a line comes from keeps growing until it is drawn, and
        # a derived line (the EMA) is computed now, so both must be frozen together.
        if len(self.steps) != len(self.values):
            raise ValueError(f"{len(self.steps)} steps but {len(self.values)} values")
        self.steps = list(self.steps)
        self.values = list(self.values)


@dataclass
class Chart:
    """A renderable chart of ``lines`` (drawn in order; later ones on top).

    ``log_y``: True, False, or "auto" (log when every value is > 0 and they span more
    than ``AUTO_LOG_RATIO``). ``hlines`` are horizontal reference lines (value, style).
    ``height`` (rows, x labels included) wins over the console's; without either, 8.
    ``x_range`` (steps ``(lo, hi)``) shows only that range, its y axis fitted to it;
    ``cursor`` draws a vertical line at that step.
    """

    lines: list[Line] = field(default_factory=list)
    log_y: bool | str = False
    hlines: list[tuple[float, Style | str]] = field(default_factory=list)
    height: int | None = None
    empty_text: str = "waiting for data…"
    x_range: tuple[float, float] | None = None
    cursor: float | None = None

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        height = self.height or options.height or 8
        for row in render(self, options.max_width, height):
            yield from row
            yield Segment.line()


AUTO_LOG_RATIO = 50.0

CURSOR_STYLE = Style(color="bright_white", bold=True)


# --------------------------------------------------------------------------- ticks


def nice_ticks(lo: float, hi: float, max_ticks: int) -> list[float]:
    """Round tick values (1, 2, 5 x 10^k apart) inside [lo, hi], at most ``max_ticks``."""
    if max_ticks < 1 or not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo] if max_ticks >= 1 and math.isfinite(lo) else []
    raw = (hi - lo) / max(1, max_ticks - 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    for mult in (1, 2, 2.5, 5, 10):
        step = mult * magnitude
        first = math.ceil(lo / step - 1e-9)
        last = math.floor(hi / step + 1e-9)
        if last - first + 1 <= max_ticks:
            break
    ticks = [round(i * step, 12) for i in range(first, last + 1)]
    return [t if t != 0 else 0.0 for t in ticks]


def log_ticks(lo: float, hi: float, max_ticks: int) -> list[float]:
    """Tick values for a log axis: powers of ten, with 2x and 5x when there is room."""
    if lo <= 0 or hi <= lo or max_ticks < 1:
        return []
    e0, e1 = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    for mults in ((1, 2, 5), (1, 3), (1,)):
        ticks = [m * 10.0 ** e for e in range(e0, e1 + 1) for m in mults]
        ticks = [t for t in ticks if lo * (1 - 1e-9) <= t <= hi * (1 + 1e-9)]
        if len(ticks) <= max_ticks:
            break
    while len(ticks) > max_ticks:
        ticks = ticks[::2]
    return ticks


def tick_label(value: float, step: float) -> str:
    """A label precise enough to tell ticks ``step`` apart, and no more."""
    if value == 0:
        return "0"
    if abs(value) >= 1000 or abs(step) >= 1000:
        return fmt_si(value, 3)
    if abs(value) >= 0.01 or step >= 0.01:
        decimals = min(6, max(0, -math.floor(math.log10(step) + 1e-9)))
        return f"{value:.{decimals}f}"
    digits = math.floor(math.log10(abs(value))) - math.floor(math.log10(step) + 1e-9) + 1
    return fmt_si(value, min(4, max(1, digits)))


# -------------------------------------------------------------------------- render


def _bounds(chart: Chart) -> tuple[float, float, float, float, bool] | None:
    """(x0, x1, y0, y1, log) over every drawable point, or None when nothing is drawable."""
    x0 = x1 = None
    ys: list[float] = []
    for line in chart.lines:
        if not line.steps:
            continue
        x0 = line.steps[0] if x0 is None else min(x0, line.steps[0])
        x1 = line.steps[-1] if x1 is None else max(x1, line.steps[-1])
        # The protocol turns non-finite values into None; the slow filter runs only then.
        finite = line.values if None not in line.values else [v for v in line.values if v is not None]
        finite = finite if all(map(math.isfinite, (min(finite, default=0), max(finite, default=0)))) \
            else [v for v in finite if math.isfinite(v)]
        if finite:
            ys.append(min(finite))
            ys.append(max(finite))
    ys += [v for v, _ in chart.hlines if v is not None and math.isfinite(v)]
    if x0 is None or not ys:
        return None
    y0, y1 = min(ys), max(ys)
    log = chart.log_y
    if log == "auto":
        log = y0 > 0 and y1 / y0 > AUTO_LOG_RATIO
    elif log and y0 <= 0:
        log = False
    if log:
        y0, y1 = math.log10(y0), math.log10(y1)
    if y1 - y0 < 1e-12 * max(1.0, abs(y1)):
        pad = abs(y0) * 0.1 if y0 else 1.0
        if log:
            pad = 0.5
        y0, y1 = y0 - pad, y1 + pad
    else:
        pad = (y1 - y0) * 0.04
        y0, y1 = y0 - pad, y1 + pad
    return float(x0), float(x1), y0, y1, bool(log)


def _clip(chart: Chart) -> Chart:
    """The chart with its lines cut to ``x_range`` (the y axis then fits what is in view)."""
    lo, hi = chart.x_range
    lines = []
    for line in chart.lines:
        a, b = bisect.bisect_left(line.steps, lo), bisect.bisect_right(line.steps, hi)
        lines.append(Line(line.steps[a:b], line.values[a:b], line.style, line.dashed))
    return Chart(lines, chart.log_y, chart.hlines, chart.height, chart.empty_text, None, chart.cursor)


def render(chart: Chart, width: int, height: int) -> list[list[Segment]]:
    """The chart as ``height`` rows of segments, each row exactly ``width`` cells wide."""
    width, height = max(1, width), max(1, height)
    x_range = chart.x_range
    if x_range is not None:
        chart = _clip(chart)
    bounds = _bounds(chart)
    if bounds is None or width < 8 or height < 2:
        return _empty(chart.empty_text if bounds is None else "", width, height)
    x0, x1, y0, y1, log = bounds
    if x_range is not None:
        x0, x1 = float(x_range[0]), float(max(x_range[1], x_range[0] + 1))
    rows = height - 1

    if log:
        ticks = log_ticks(10 ** y0, 10 ** y1, max(2, rows // 2 + 1))
        labels = [(math.log10(t), fmt_si(t, 2)) for t in ticks]
    else:
        ticks = nice_ticks(y0, y1, max(2, rows // 2 + 1))
        step = ticks[1] - ticks[0] if len(ticks) > 1 else abs(ticks[0]) or 1.0
        labels = [(t, tick_label(t, step)) for t in ticks]
    label_w = max((len(text) for _, text in labels), default=1)
    plot_w = max(1, width - label_w - 1)
    pw, ph = plot_w * 2, rows * 4

    def to_py(v: float) -> int:
        return round((y1 - v) / (y1 - y0) * (ph - 1))

    bits = [[0] * plot_w for _ in range(rows)]
    owner: list[list[Style | None]] = [[None] * plot_w for _ in range(rows)]

    def plot(px: int, py: int, style) -> None:
        if 0 <= px < pw and 0 <= py < ph:
            r, c = py >> 2, px >> 1
            bits[r][c] |= _DOTS[py & 3][px & 1]
            owner[r][c] = style

    for value, style in chart.hlines:
        if value is None or not math.isfinite(value) or (log and value <= 0):
            continue
        py = to_py(math.log10(value) if log else value)
        for px in range(0, pw, 2):
            plot(px, py, _style(style))

    x_scale = (pw - 1) / (x1 - x0) if x1 > x0 else 0.0
    for line in chart.lines:
        _draw_line(line, _style(line.style), x0, x_scale, log, to_py, plot)
    if chart.cursor is not None and x0 <= chart.cursor <= x1:
        px = round((chart.cursor - x0) * x_scale)
        for py in range(0, ph, 2):  # dotted, over the lines
            plot(px, py, CURSOR_STYLE)

    # Y labels sit on the row holding their tick.
    row_labels: dict[int, str] = {}
    for value, text in labels:
        row_labels.setdefault(to_py(value) >> 2, text)

    out: list[list[Segment]] = []
    for r in range(rows):
        label = row_labels.get(r)
        row = [Segment((label or "").rjust(label_w), AXIS_STYLE),
               Segment("┤" if label is not None else "│", AXIS_STYLE)]
        for c in range(plot_w):
            b = bits[r][c]
            if b:
                row.append(Segment(chr(BRAILLE_BASE + b), owner[r][c]))
            else:
                row.append(Segment(" "))
        out.append(_merge(row))
    out.append([Segment(" " * (label_w + 1)), Segment(_x_axis(x0, x1, plot_w), AXIS_STYLE)])
    return out


def _style(style: Style | str) -> Style:
    return Style.parse(style) if isinstance(style, str) else style


def _draw_line(line: Line, style: Style, x0: float, x_scale: float, log: bool, to_py, plot) -> None:
    if line.dashed:
        solid = plot

        def plot(px: int, py: int, style) -> None:  # noqa: F811 - dashes: 2 pixels on, 2 off
            if px % 4 < 2:
                solid(px, py, style)

    cols, breaks = _columns(line, x0, x_scale, log, to_py)
    prev: tuple[int, int] | None = None
    for px, (first, last, lo, hi) in cols:
        if prev is not None and px not in breaks:
            _segment(prev[0], prev[1], px, first, style, plot)
        for py in range(lo, hi + 1):
            plot(px, py, style)
        prev = (px, last)


def _columns(line: Line, x0: float, x_scale: float, log: bool, to_py):
    """Per pixel column: (first, last, top, bottom) pixel rows; plus columns after a gap.

    Steps are sorted, so each column is a slice found by bisection and reduced with the
    builtin min/max; only a series holding None (or, on a log axis, values <= 0) takes
    the slower per-point path that breaks the line at each gap.
    """
    steps, values = line.steps, line.values
    if not steps:
        return [], set()
    clean = None not in values and (not log or min(values) > 0)
    if clean and all(map(math.isfinite, (min(values), max(values)))):
        f = math.log10 if log else float
        out = []
        if x_scale == 0:
            bounds = [(0, 0, len(steps))]
        else:
            last_px = round((steps[-1] - x0) * x_scale)
            edges = [bisect.bisect_left(steps, x0 + (px + 0.5) / x_scale) for px in range(last_px + 1)]
            bounds, start = [], 0
            for px, end in enumerate(edges):
                if end > start:
                    bounds.append((px, start, end))
                    start = end
            if start < len(steps):
                bounds.append((last_px, start, len(steps)))
        for px, a, b in bounds:
            chunk = values[a:b]
            out.append((px, (to_py(f(chunk[0])), to_py(f(chunk[-1])), to_py(f(max(chunk))), to_py(f(min(chunk))))))
        return out, set()
    cols: dict[int, list[int]] = {}
    order: list[int] = []
    breaks: set[int] = set()
    pending_break = False
    for s, v in zip(steps, values):
        if v is None or not math.isfinite(v) or (log and v <= 0):
            pending_break = True
            continue
        px = round((s - x0) * x_scale)
        py = to_py(math.log10(v) if log else v)
        col = cols.get(px)
        if col is None:
            cols[px] = [py, py, py, py]
            order.append(px)
            if pending_break:
                breaks.add(px)
        else:
            col[1] = py
            col[2] = min(col[2], py)
            col[3] = max(col[3], py)
        pending_break = False
    return [(px, tuple(cols[px])) for px in order], breaks


def _segment(xa: int, ya: int, xb: int, yb: int, style, plot) -> None:
    """Bresenham from (xa, ya) to (xb, yb)."""
    dx, dy = abs(xb - xa), -abs(yb - ya)
    sx, sy = (1 if xb > xa else -1), (1 if yb > ya else -1)
    err = dx + dy
    while True:
        plot(xa, ya, style)
        if xa == xb and ya == yb:
            return
        e2 = 2 * err
        if e2 >= dy:
            err += dy
            xa += sx
        if e2 <= dx:
            err += dx
            ya += sy


def _x_axis(x0: float, x1: float, plot_w: int) -> str:
    """Step labels under the plot, placed at their column and never overlapping."""
    cells = [" "] * plot_w
    if x1 <= x0:
        text = fmt_si(x0)
        cells[:len(text)] = text[:plot_w]
        return "".join(cells)
    max_labels = max(2, plot_w // 8)
    ticks = [t for t in nice_ticks(x0, x1, max_labels) if t == int(t)]
    free_from = 0
    for t in ticks:
        text = fmt_si(t, 3)
        col = round((t - x0) / (x1 - x0) * (plot_w * 2 - 1)) // 2
        start = min(max(0, col - len(text) // 2), plot_w - len(text))
        if start < free_from or start < 0:
            continue
        cells[start:start + len(text)] = text
        free_from = start + len(text) + 1
    return "".join(cells)


def _merge(row: list[Segment]) -> list[Segment]:
    """Join neighbouring segments of the same style (fewer segments, faster terminals)."""
    merged: list[Segment] = []
    for seg in row:
        if merged and merged[-1].style == seg.style:
            merged[-1] = Segment(merged[-1].text + seg.text, seg.style)
        else:
            merged.append(seg)
    return merged


def _empty(text: str, width: int, height: int) -> list[list[Segment]]:
    rows = [[Segment(" " * width)] for _ in range(height)]
    if text:
        text = text[:width]
        pad = (width - len(text)) // 2
        rows[height // 2] = [Segment(" " * pad), Segment(text, AXIS_STYLE), Segment(" " * (width - pad - len(text)))]
    return rows


def to_text(rows: list[list[Segment]]) -> list[str]:
    """The plain characters of rendered rows (for tests and logs)."""
    return ["".join(seg.text for seg in row) for row in rows]
