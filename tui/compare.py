"""Runs side by side: reference runs read from their stores, overlaid charts, key figures.

``ptdash show A B`` draws B (and C...) beside A, ``ptdash attach RUN --compare OTHER``
draws OTHER behind a live run. Each run keeps one colour on every chart and in the
table: the loss (its EMA, the raw lines of several runs being noise on noise), the
first LR series, the total gradient norm and the first printed metric (a validation
loss), aligned by step or, with ``by_time``, by
seconds since each run's first step. Pure: no Textual; the Overview draws what the
builders here return.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rich.text import Text

from ptdash.shared import names
from ptdash.shared.config import RunInfo
from ptdash.shared.numbers import ema_series
from ptdash.shared.protocol import ENDED
from ptdash.shared.rows import RowReader
from ptdash.shared.store import STORE_NAME, StoreError

from .chart import Chart, Line
from .fmt import fmt_duration, fmt_si
from .series import Series
from .source import read_run_info
from .source.history import HISTORY_POINTS
from .tabs.overview import metric_groups
from .view import ChartView

if TYPE_CHECKING:
    from .state import RunState

COLOURS = ("bright_cyan", "magenta", "yellow", "bright_green", "bright_blue", "red")
"""One colour per run, the main run's first."""

CLOCK_POINTS = 1000
"""Steps at which a run's wall time is read, to place any of its steps in time."""


@dataclass
class Reference:
    """A run to compare with, as read once from its run dir (a run still training is not followed)."""

    path: Path
    info: RunInfo | None
    series: dict[str, Series] = field(default_factory=dict)
    """``loss``, ``grad/norm_total`` and the LR series, decimated like the dashboard's."""
    clock: Series = field(default_factory=Series)
    """Wall time (value) of steps spread over the run."""


def load_reference(path: Path) -> Reference:
    """Read what the compare view draws of the run at ``path`` (empty when it has no store yet)."""
    ref = Reference(Path(path), read_run_info(Path(path)))
    try:
        reader = RowReader(Path(path) / STORE_NAME)
    except StoreError:
        return ref
    with reader:
        found = reader.names()
        for name in (names.LOSS, names.GRAD_NORM, *names.lr_names(found),
                     *(n for n in found if names.parse_printed(n) is not None)):
            steps, values = reader.series(name, max_points=HISTORY_POINTS)
            if steps:
                ref.series[name] = Series()
                ref.series[name].extend(steps, values)
        ref.clock.extend(*reader.clock(CLOCK_POINTS))
    return ref


@dataclass
class Run:
    """One run as the compare view draws it: a label, a colour, its series and its clock."""

    label: str
    colour: str
    series: dict[str, Series]
    clock: Series
    info: RunInfo | None
    state: str | None = None
    """The state to show (the main run's live status); run.json's when None."""


class Comparison:
    """What the app compares its run with: the run dirs, how they are aligned, and what was read.

    ``start`` reads each compared run (and the main run's clock, since its history holds
    only its newest walls) on a thread of its own, keeps it, and posts it to wake the
    app, which redraws; ``runs`` is called on the app's thread.
    """

    def __init__(self, dirs: tuple[Path, ...] = (), by_time: bool = False) -> None:
        self.dirs = tuple(Path(p) for p in dirs)
        self.by_time = by_time
        """Align the runs by seconds since their first step instead of by step."""
        self.main: Path | None = None
        self._read: dict[Path, Reference] = {}
        self._merged = False

    @property
    def active(self) -> bool:
        """Whether any run is compared."""
        return bool(self.dirs)

    @property
    def loaded(self) -> bool:
        """Whether every compared run (and the main run's clock) has been read."""
        return not self.dirs or all(p in self._read for p in (*self.dirs, self.main))

    def start(self, main: Path, post: Callable[[object], None]) -> None:
        """Read the runs in the background; returns at once (nothing to do when none is compared)."""
        self.main = Path(main)
        if self.dirs:
            threading.Thread(target=self._load, args=(post,), name="ptdash-compare", daemon=True).start()

    def _load(self, post: Callable[[object], None]) -> None:
        for path in (*self.dirs, self.main):
            ref = load_reference(path)
            self._read[path] = ref  # one key set at a time: the app only looks keys up
            post(ref)  # only wakes the app (it keeps no such delivery): its redraw calls ``runs``

    def toggle_time(self) -> None:
        """Align by time if by step, and back."""
        self.by_time = not self.by_time

    def runs(self, state: RunState) -> list[Run] | None:
        """The runs to overlay, the main one first (drawn from its live state); None when none is compared."""
        if not self.dirs:
            return None
        if not self._merged and self.main in self._read:
            clock = self._read[self.main].clock
            state.clock.merge(clock.steps, clock.values)
            self._merged = True
        refs = [self._read[p] for p in self.dirs if p in self._read]
        names = labels([(self.main, state.info), *((r.path, r.info) for r in refs)])
        status = state.status.state if state.status is not None else None
        out = [Run(names[0], COLOURS[0], state.series, state.clock, state.info, state=status)]
        for i, ref in enumerate(refs, 1):
            out.append(Run(names[i], COLOURS[i % len(COLOURS)], ref.series, ref.clock, ref.info))
        return out


def labels(infos: list[tuple[Path, RunInfo | None]]) -> list[str]:
    """Each run's name, or its directory's when two runs share a name."""
    names = [(info.name if info is not None else "") or path.name for path, info in infos]
    return [path.name if names.count(name) > 1 else name for (path, _), name in zip(infos, names)]


def elapsed(steps: list[int], clock: Series) -> list[float]:
    """Seconds since the run's first step at each of ``steps`` (sorted), interpolated on ``clock``.

    Steps outside the clock take its nearest end: a live run's clock grows with each step.
    """
    cs, cw = clock.steps, clock.values
    if not cs:
        return [0.0] * len(steps)
    out = []
    for step in steps:
        i = bisect.bisect_left(cs, step)
        if i <= 0:
            wall = cw[0]
        elif i >= len(cs):
            wall = cw[-1]
        elif cs[i] == step:
            wall = cw[i]
        else:
            s0, s1, w0, w1 = cs[i - 1], cs[i], cw[i - 1], cw[i]
            wall = w0 + (w1 - w0) * (step - s0) / (s1 - s0)
        out.append(wall - cw[0])
    return out


TIME_UNITS = ((36_000, 3600, "h"), (600, 60, "min"), (0, 1, "s"))
"""(longest span in seconds, seconds per unit, name): the x unit of a chart by time."""


def time_unit(runs: list[Run]) -> tuple[float, str]:
    """The unit for an x axis in time: seconds, minutes or hours, by the longest run."""
    span = max((r.clock.values[-1] - r.clock.values[0] for r in runs if r.clock.values), default=0.0)
    return next((size, name) for limit, size, name in TIME_UNITS if span >= limit)


def _line(run: Run, name: str, by_time: tuple[float, str] | None, smooth: bool = False) -> Line | None:
    series = run.series.get(name)
    if series is None or not series.steps:
        return None
    values = ema_series(series.values, 1 - ChartView.smoothing, series.steps) if smooth else series.values
    xs = series.steps if by_time is None else [t / by_time[0] for t in elapsed(series.steps, run.clock)]
    return Line(xs, values, run.colour)


def _overlay(runs: list[Run], pick, by_time: bool, smooth: bool = False, log_y: bool | str = False,
             digits: int = 4) -> tuple[Text, Chart]:
    """One line per run (the main one last, so on top) and a legend naming each in its colour."""
    unit = time_unit(runs) if by_time else None
    lines, parts = [], []
    if unit is not None:
        parts.append(Text(f"x: {unit[1]}", "dim"))
    for run in runs:
        name = pick(run)
        line = _line(run, name, unit, smooth) if name else None
        latest = next((v for v in reversed(line.values) if v is not None), None) if line else None
        parts.append(Text.assemble(("━ ", run.colour), (run.label, run.colour), " ",
                                   (fmt_si(latest, digits) if line else "—", "bold")))
        if line is not None:
            lines.append(line)
    return Text("  ").join(parts), Chart(lines[1:] + lines[:1], log_y=log_y)


def loss(runs: list[Run], by_time: bool = False) -> tuple[Text, Chart]:
    """Each run's smoothed loss (EMA), log scale once it spans decades."""
    return _overlay(runs, lambda r: names.LOSS, by_time, smooth=True, log_y="auto")


def lr(runs: list[Run], by_time: bool = False) -> tuple[Text, Chart]:
    """Each run's first LR series (its main optimizer's first param group)."""
    return _overlay(runs, lambda r: next(iter(names.lr_names(r.series)), None), by_time, digits=3)


def grad(runs: list[Run], by_time: bool = False) -> tuple[Text, Chart]:
    """Each run's total gradient norm before clipping."""
    return _overlay(runs, lambda r: names.GRAD_NORM, by_time, log_y="auto")


def printed(runs: list[Run], by_time: bool = False) -> tuple[Text, Chart]:
    """Each run's printed metric that the main run's metrics panel starts with (its validation
    loss, where it printed one), by that name."""
    name = next((n for group in metric_groups(runs[0]) for n in group if n != names.LOSS), None)
    legend, chart = _overlay(runs, lambda r: name, by_time, log_y="auto")
    return (Text.assemble((names.parse_printed(name) or "", "dim"), "  ", legend) if name else legend), chart


def versions(runs: list[Run], by_time: bool) -> tuple:
    """A fingerprint of everything the overlays read, to skip redraws of unchanged data."""
    return by_time, tuple((r.label, r.clock.version, *(s.version for s in r.series.values())) for r in runs)


FIGURES = ("run", "state", "steps", "time", "steps/s", "loss first → last", "best loss", "last lr", "grad norm")
"""The columns of the key-figures table."""

KEEP_ORDER = (0, 1, 2, 5, 6, 3, 7, 8, 4)
"""Which columns a narrow table keeps first: run, state, steps, the losses, then the rest."""


def fit_columns(rows: list[list[str]], width: int, gap: int = 2) -> list[int]:
    """The columns (in table order) that fit in ``width`` cells, the least needed left out first."""
    widths = [max(len(FIGURES[i]), *(len(r[i]) for r in rows)) + (2 if i == 0 else 0) for i in range(len(FIGURES))]
    kept = list(KEEP_ORDER)
    while len(kept) > 1 and sum(widths[i] + gap for i in kept) > width:
        kept.pop()
    return sorted(kept)


def figures(run: Run) -> list[str]:
    """The run's row of the key-figures table, as text (``—`` where unknown)."""
    info = run.info
    loss = run.series.get(names.LOSS)
    found = [(s, v) for s, v in zip(loss.steps, loss.values) if v is not None] if loss else []
    best = min(found, key=lambda p: p[1]) if found else None
    lr_name = next(iter(names.lr_names(run.series)), None)
    lr_value = run.series[lr_name].latest() if lr_name else None
    norm = run.series.get(names.GRAD_NORM)
    norms = [v for v in norm.values if v is not None] if norm else []
    clock = run.clock
    span = clock.values[-1] - clock.values[0] if len(clock) > 1 else None
    rate = (clock.steps[-1] - clock.steps[0]) / span if span else None
    steps = max((s.last_step for s in run.series.values() if s.last_step is not None), default=None)
    state = run.state or (info.status if info is not None else None)
    if state in ENDED and info is not None and info.exit_code not in (None, 0):
        state += f" ({info.exit_code})"
    return [run.label, state or "—", f"{steps:,}" if steps is not None else "—",
            fmt_duration(span) if span is not None else "—", fmt_si(rate) if rate else "—",
            f"{fmt_si(found[0][1], 4)} → {fmt_si(found[-1][1], 4)}" if found else "—",
            f"{fmt_si(best[1], 4)} @{best[0]:,}" if best else "—", fmt_si(lr_value, 3) if lr_name else "—",
            f"{fmt_si(min(norms), 3)}–{fmt_si(max(norms), 3)}" if norms else "—"]
