"""What each Overview chart shows: pure functions from RunState and ChartView to a Panel.

No Textual here; the ChartPanel widget only draws what these return, so the choice of
series, colours and summary numbers is tested without an app. Every chart shares the
view: the zoomed step range, the cursor whose values the legends read, the smoothing
and the y scale.
"""

from __future__ import annotations

import bisect
import re
from typing import NamedTuple

from rich.text import Text

from ptdash.shared.numbers import ema_series

from ..chart import Chart, Line
from ..fmt import fmt_num, fmt_si
from ..state import RunState
from ..view import ChartView

CLIPPED_WINDOW = 100
"""Recent steps over which the share of clipped steps is reported."""

PALETTE = ("green", "cyan", "magenta", "yellow", "bright_blue", "red")

_LR = re.compile(r"^opt(\d*)/lr/group(\d+)$")

CHARTED = ("loss", "grad/norm_total", "time/step_s", "throughput/samples_per_s")
"""Series whose steps make the charts' common step range (with the LR series)."""


class Panel(NamedTuple):
    """One chart as drawn: the legend (after the title), the chart, a note under it."""

    legend: Text
    chart: Chart
    note: Text = Text()


def _value(label: str, value: float | None, style: str, fmt=fmt_num, digits: int = 4) -> Text:
    return Text.assemble((f"{label} " if label else "", "dim"), (fmt(value, digits), style))


def _join(parts: list[Text]) -> Text:
    return Text("  ").join(parts)


def _others(state: RunState, suffix: str) -> list[tuple[str, str]]:
    """``(series name, label)`` of the other optimizers' ``opt<k>/<suffix>`` series."""
    found = sorted((int(m.group(1)), n) for n in state.series if (m := re.match(rf"^opt(\d+)/{suffix}$", n)))
    return [(n, state.optimizers.get(k) or f"opt{k}") for k, n in found]


def value_at(steps: list[int], values: list, step: int | None) -> float | None:
    """The value at ``step`` (the newest at or before it), or the newest when ``step`` is None."""
    if not steps:
        return None
    if step is None:
        return values[-1]
    if step > steps[-1]:
        return None  # not recorded (yet): the cursor is on the schedule ahead
    i = bisect.bisect_right(steps, step) - 1
    return values[i] if i >= 0 else None


def extent(state: RunState) -> tuple[int, int, int] | None:
    """The first and last step the charts hold, and the last the schedule ahead reaches
    (the last step again without one); None before any step."""
    first = last = None
    names = (*CHARTED, *lr_names(state.series))
    for series in (state.series.get(n) for n in names):
        if series is not None and series.steps:
            first = series.steps[0] if first is None else min(first, series.steps[0])
            last = series.steps[-1] if last is None else max(last, series.steps[-1])
    if first is None:
        return None
    ahead = state.schedule.steps if state.schedule is not None else []
    return first, last, max(last, ahead[-1] if ahead else last)


def _chart(view: ChartView, state: RunState, lines: list[Line], log_y: bool | str = False, **kw) -> Chart:
    bounds = extent(state)
    window = view.window(*bounds[:2]) if bounds is not None else None
    return Chart(lines, view.log_y(log_y), x_range=window, cursor=view.cursor, **kw)


def _scale_note(view: ChartView) -> list[Text]:
    if view.scale == "auto":
        return []
    return [Text(view.scale, "dim")]


def _cursor(view: ChartView) -> list[Text]:
    return [Text(f"@{view.cursor:,}", "bold bright_white")] if view.cursor is not None else []


def loss(state: RunState, view: ChartView) -> Panel:
    """Raw loss (dim) under its EMA (bright); log scale once it spans decades. The other
    optimizers' losses (a GAN's generator) in their own colours."""
    series = state.series.get("loss")
    if series is None or not series.steps:
        if state.no_step:
            return Panel(Text(f"no step found: {state.no_step}", "yellow"), Chart())
        return Panel(Text("no loss yet", "dim"), Chart())
    at = view.cursor
    lines = [Line(series.steps, series.values, "grey50" if view.smoothing else "bright_cyan")]
    parts = _cursor(view) + [_value("", value_at(series.steps, series.values, at), "bold")]
    if view.smoothing:
        smooth = ema_series(series.values, 1 - view.smoothing, series.steps)
        lines.append(Line(series.steps, smooth, "bright_cyan"))
        if at is None:
            last = next((v for v in reversed(smooth) if v is not None), None)
        else:
            last = value_at(series.steps, smooth, at)
        parts.append(_value("ema", last, "bold bright_cyan"))
    if at is None and series.latest() is None:
        parts.append(Text("non-finite", "bold red"))
    for i, (name, label) in enumerate(_others(state, "loss")):
        other = state.series[name]
        style = PALETTE[(i + 2) % len(PALETTE)]
        values = ema_series(other.values, 1 - view.smoothing, other.steps) if view.smoothing else other.values
        lines.append(Line(other.steps, values, style))
        parts.append(_value(label, value_at(other.steps, values, at), style))
    note = [Text(f"ema {view.smoothing:g}" if view.smoothing else "no smoothing", "dim")]
    return Panel(_join(parts), _chart(view, state, lines, "auto"), _join(note + _scale_note(view)))


def lr_names(names) -> list[str]:
    """The LR series, main optimizer first, then by group number."""
    found = [(int(m.group(1) or -1), int(m.group(2)), n) for n in names if (m := _LR.match(n))]
    return [n for *_, n in sorted(found)]


def lr(state: RunState, view: ChartView) -> Panel:
    """Effective LR of every param group of every optimizer, one colour each, and the main
    optimizer's schedule ahead (dimmed, times the live LR factor) to its end."""
    names = lr_names(state.series)
    if not names and "user/lr" in state.series:
        names = ["user/lr"]  # the script reports its own LR with ptdash.log(lr=...)
    if not names:
        if "loss" in state.series and not state.optimizers and "grad/norm_total" in state.series:
            return Panel(Text("LR unknown: no torch.optim optimizer (ptdash.log(lr=...) reports one)", "dim"),
                         Chart())
        return Panel(Text("no LR yet", "dim"), Chart())
    lines, parts = [], _cursor(view)
    scale = state.status.lr_scale if state.status is not None else 1.0
    if scale != 1.0:
        parts.append(Text(f"×{fmt_num(scale)}", "bold yellow"))
    schedule = state.schedule
    ahead = schedule.steps if schedule is not None else []
    for i, name in enumerate(names):
        series = state.series[name]
        style = PALETTE[i % len(PALETTE)]
        lines.append(Line(series.steps, series.values, style))
        group = int(name.rpartition("group")[2]) if name.startswith("opt/") else None
        steps, values = [], []
        if group is not None and group < len(schedule.lrs if schedule else []) and series.steps:
            start = bisect.bisect_right(ahead, series.steps[-1])
            steps = [series.steps[-1], *ahead[start:]]
            values = [series.values[-1], *(v * scale for v in schedule.lrs[group][start:])]
            if len(steps) > 1:
                lines.append(Line(steps, values, f"dim {style}"))
        if i < 4:
            label = "" if len(names) == 1 else _lr_label(state, name)
            at = view.cursor
            value = value_at(series.steps, series.values, at)
            if at is not None and steps and at > series.steps[-1]:
                value = value_at(steps, values, at)
            parts.append(_value(label, value, style, digits=3))
    if len(names) > 4:
        parts.append(Text(f"+{len(names) - 4}", "dim"))
    if schedule is not None and schedule.note:
        note = [Text(f"{schedule.note}: history only", "italic yellow")]
    elif ahead:
        note = [Text("schedule ahead" + (f" to {schedule.end:,}" if schedule.end else ""), "dim")]
    else:
        note = []
    return Panel(_join(parts), _chart(view, state, lines), _join(note + _scale_note(view)))


def _lr_label(state: RunState, name: str) -> str:
    """``g0`` for the main optimizer's group 0, ``Generator g0`` for another optimizer's."""
    m = _LR.match(name)
    if m is None:
        return name
    k, group = m.group(1), m.group(2)
    return f"g{group}" if not k else f"{state.optimizers.get(int(k)) or 'opt' + k} g{group}"


def grad(state: RunState, view: ChartView) -> Panel:
    """Pre-clip total gradient norm, with the clip threshold in effect as a dashed line."""
    norm = state.series.get("grad/norm_total")
    if norm is None or not norm.steps:
        return Panel(Text("no gradients yet", "dim"), Chart())
    at = view.cursor
    lines = [Line(norm.steps, norm.values, "magenta")]
    parts = _cursor(view) + [_value("", value_at(norm.steps, norm.values, at), "bold magenta")]
    clip = state.series.get("grad/clip_max")
    if clip is not None and clip.steps:
        lines.append(Line(clip.steps, clip.values, "red", dashed=True))
        if at is not None or clip.last_step == norm.last_step:
            parts.append(_value("clip", value_at(clip.steps, clip.values, at), "red"))
    clipped = state.series.get("grad/clipped")
    if clipped is not None and clipped.steps:
        recent = [v for v in clipped.values[-CLIPPED_WINDOW:] if v is not None]
        if recent and any(recent):
            parts.append(Text.assemble(("clipped ", "dim"), (f"{100 * sum(recent) / len(recent):.0f}%", "red")))
    for i, (name, label) in enumerate(_others(state, "grad/norm_total")):
        other = state.series[name]
        style = PALETTE[(i + 3) % len(PALETTE)]
        lines.append(Line(other.steps, other.values, style))
        parts.append(_value(label, value_at(other.steps, other.values, at), style))
    return Panel(_join(parts), _chart(view, state, lines, "auto"), _join(_scale_note(view)))


def speed(state: RunState, view: ChartView) -> Panel:
    """Samples/s when the engine knows the batch size, else seconds per step."""
    samples = state.series.get("throughput/samples_per_s")
    step_s = state.series.get("time/step_s")
    at = view.cursor
    if samples is not None and samples.steps:
        legend = _join(_cursor(view) + [_value("", value_at(samples.steps, samples.values, at), "bold green",
                                               fmt_si, 3)])
        legend.append(" samples/s", "dim")
        lines = [Line(samples.steps, samples.values, "green4" if view.smoothing else "bright_green")]
        if view.smoothing:
            lines.append(Line(samples.steps, ema_series(samples.values, 1 - view.smoothing, samples.steps),
                              "bright_green"))
        return Panel(legend, _chart(view, state, lines), _join(_scale_note(view)))
    if step_s is not None and step_s.steps:
        legend = _join(_cursor(view) + [_value("", value_at(step_s.steps, step_s.values, at), "bold green")])
        legend.append(" s/step", "dim")
        return Panel(legend, _chart(view, state, [Line(step_s.steps, step_s.values, "green")], "auto"),
                     _join(_scale_note(view)))
    return Panel(Text("no timings yet", "dim"), Chart())


def versions(state: RunState, names: tuple[str, ...]) -> tuple:
    """A cheap fingerprint of the series a panel reads, to skip redraws of unchanged data."""
    return tuple(state.series[n].version if n in state.series else -1 for n in names)
