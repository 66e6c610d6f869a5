"""What each Overview chart shows: pure functions from RunState and ChartView to a Panel.

No Textual here; the ChartPanel widget only draws what these return, so the choice of
series, colours and summary numbers is tested without an app. Every chart shares the
view: the zoomed step range, the cursor whose values the legends read, the smoothing
and the y scale.
"""

from __future__ import annotations

import bisect
from typing import Callable, NamedTuple

from rich.text import Text

from ptdash.shared import names
from ptdash.shared.numbers import ema_series

from ..chart import Chart, Line
from ..fmt import fmt_num, fmt_si
from ..state import RunState
from ..view import ChartView

CLIPPED_WINDOW = 100
"""Recent steps over which the share of clipped steps is reported."""

PALETTE = ("green", "cyan", "magenta", "yellow", "bright_blue", "red")

CHARTED = (names.LOSS, names.GRAD_NORM, names.STEP_S, names.SAMPLES_PER_S)
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


def _label(state: RunState, series: str) -> str:
    """An optimizer's series by the optimizer's name (``Generator``), or ``opt<k>``."""
    index, _ = names.optimizer_of(series)
    return state.optimizers.get(index) or f"opt{index}"


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
    for series in (state.series.get(n) for n in (*CHARTED, *names.lr_names(state.series))):
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


def loss_reads(state: RunState) -> tuple[str, ...]:
    """The loss chart's series: the loss, then the other optimizers' (a GAN's generator)."""
    return (names.LOSS, *(n for _, n in names.others(state.series, names.LOSS)))


def loss(state: RunState, view: ChartView, reads: tuple[str, ...] | None = None) -> Panel:
    """Raw loss (dim) under its EMA (bright); log scale once it spans decades. The other
    optimizers' losses (a GAN's generator) in their own colours. ``reads`` is what
    ``loss_reads`` returned (found again when not given)."""
    main, *others = reads or loss_reads(state)
    series = state.series.get(main)
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
    for i, name in enumerate(others):
        other = state.series[name]
        style = PALETTE[(i + 2) % len(PALETTE)]
        values = ema_series(other.values, 1 - view.smoothing, other.steps) if view.smoothing else other.values
        lines.append(Line(other.steps, values, style))
        parts.append(_value(_label(state, name), value_at(other.steps, values, at), style))
    note = [Text(f"ema {view.smoothing:g}" if view.smoothing else "no smoothing", "dim")]
    return Panel(_join(parts), _chart(view, state, lines, "auto"), _join(note + _scale_note(view)))


def lr_reads(state: RunState) -> tuple[str, ...]:
    """The LR chart's series: every optimizer's LRs, main first; with none, the LR the
    script reports with ``ptdash.log(lr=...)``."""
    return tuple(names.lr_names(state.series)) or (names.USER_LR,)


def lr(state: RunState, view: ChartView, reads: tuple[str, ...] | None = None) -> Panel:
    """Effective LR of every param group of every optimizer, one colour each, and the main
    optimizer's schedule ahead (dimmed, times the live LR factor) to its end."""
    lrs = [n for n in reads or lr_reads(state) if n in state.series]
    if not lrs:
        if names.LOSS in state.series and not state.optimizers and names.GRAD_NORM in state.series:
            return Panel(Text("LR unknown: no torch.optim optimizer (ptdash.log(lr=...) reports one)", "dim"),
                         Chart())
        return Panel(Text("no LR yet", "dim"), Chart())
    lines, parts = [], _cursor(view)
    scale = state.status.lr_scale if state.status is not None else 1.0
    if scale != 1.0:
        parts.append(Text(f"×{fmt_num(scale)}", "bold yellow"))
    schedule = state.schedule
    ahead = schedule.steps if schedule is not None else []
    for i, name in enumerate(lrs):
        series = state.series[name]
        style = PALETTE[i % len(PALETTE)]
        lines.append(Line(series.steps, series.values, style))
        where = names.parse_lr(name)
        group = where.group if where is not None and where.optimizer == 0 else None
        steps, values = [], []
        if group is not None and group < len(schedule.lrs if schedule else []) and series.steps:
            start = bisect.bisect_right(ahead, series.steps[-1])
            steps = [series.steps[-1], *ahead[start:]]
            values = [series.values[-1], *(v * scale for v in schedule.lrs[group][start:])]
            if len(steps) > 1:
                lines.append(Line(steps, values, f"dim {style}"))
        if i < 4:
            label = "" if len(lrs) == 1 else _lr_label(state, name)
            at = view.cursor
            value = value_at(series.steps, series.values, at)
            if at is not None and steps and at > series.steps[-1]:
                value = value_at(steps, values, at)
            parts.append(_value(label, value, style, digits=3))
    if len(lrs) > 4:
        parts.append(Text(f"+{len(lrs) - 4}", "dim"))
    if schedule is not None and schedule.note:
        note = [Text(f"{schedule.note}: history only", "italic yellow")]
    elif ahead:
        note = [Text("schedule ahead" + (f" to {schedule.end:,}" if schedule.end else ""), "dim")]
    else:
        note = []
    return Panel(_join(parts), _chart(view, state, lines), _join(note + _scale_note(view)))


def _lr_label(state: RunState, name: str) -> str:
    """``g0`` for the main optimizer's group 0, ``Generator g0`` for another optimizer's."""
    where = names.parse_lr(name)
    if where is None:
        return name
    if not where.optimizer:
        return f"g{where.group}"
    return f"{state.optimizers.get(where.optimizer) or f'opt{where.optimizer}'} g{where.group}"


def grad_reads(state: RunState) -> tuple[str, ...]:
    """The grad-norm chart's series: the norm, the clip in force, which steps were clipped,
    then the other optimizers' norms. The norm is the total, or, for sharded parameters (FSDP)
    that no clip reduces, rank 0's shards' own norm where no total was ever recorded."""
    norm = names.GRAD_NORM
    if norm not in state.series and names.GRAD_NORM_LOCAL in state.series:
        norm = names.GRAD_NORM_LOCAL
    return (norm, names.CLIP_MAX, names.CLIPPED, *(n for _, n in names.others(state.series, names.GRAD_NORM)))


def grad(state: RunState, view: ChartView, reads: tuple[str, ...] | None = None) -> Panel:
    """Pre-clip total gradient norm, with the clip threshold in effect as a dashed line."""
    norm_name, clip_name, clipped_name, *others = reads or grad_reads(state)
    norm = state.series.get(norm_name)
    if norm is None or not norm.steps:
        return Panel(Text("no gradients yet", "dim"), Chart())
    at = view.cursor
    lines = [Line(norm.steps, norm.values, "magenta")]
    label = "rank 0's shards" if norm_name == names.GRAD_NORM_LOCAL else ""  # a part of the total
    parts = _cursor(view) + [_value(label, value_at(norm.steps, norm.values, at), "bold magenta")]
    clip = state.series.get(clip_name)
    if clip is not None and clip.steps:
        lines.append(Line(clip.steps, clip.values, "red", dashed=True))
        if at is not None or clip.last_step == norm.last_step:
            parts.append(_value("clip", value_at(clip.steps, clip.values, at), "red"))
    clipped = state.series.get(clipped_name)
    if clipped is not None and clipped.steps:
        recent = [v for v in clipped.values[-CLIPPED_WINDOW:] if v is not None]
        if recent and any(recent):
            parts.append(Text.assemble(("clipped ", "dim"), (f"{100 * sum(recent) / len(recent):.0f}%", "red")))
    for i, name in enumerate(others):
        other = state.series[name]
        style = PALETTE[(i + 3) % len(PALETTE)]
        lines.append(Line(other.steps, other.values, style))
        parts.append(_value(_label(state, name), value_at(other.steps, other.values, at), style))
    return Panel(_join(parts), _chart(view, state, lines, "auto"), _join(_scale_note(view)))


def speed_reads(state: RunState) -> tuple[str, ...]:
    """The speed chart's series."""
    return names.SAMPLES_PER_S, names.STEP_S


def speed(state: RunState, view: ChartView, reads: tuple[str, ...] | None = None) -> Panel:
    """Samples/s when the engine knows the batch size, else seconds per step."""
    samples_name, step_name = reads or speed_reads(state)
    samples = state.series.get(samples_name)
    step_s = state.series.get(step_name)
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


METRIC_STYLES = ("bright_yellow", "bright_magenta", "bright_green", "bright_blue")
"""The printed metrics' colours, in the order of their group."""


def metric_groups(state: RunState) -> list[tuple[str, ...]]:
    """The metrics the script printed (``printed/<name>``), grouped by what they measure
    (``val_loss`` and ``train_loss`` are both a loss: names.split_of), the groups with a
    validation metric first, a validation loss before them, else in the order the store
    lists them. A loss group the script printed no
    training loss for also draws the loss ptdash records (``loss``), under the others."""
    groups: dict[str, list[str]] = {}
    for name in state.series:
        printed = names.parse_printed(name)
        if printed is not None:
            groups.setdefault(names.split_of(printed).base, []).append(name)
    out = []
    for base, members in groups.items():
        splits = {names.split_of(names.parse_printed(m)).split for m in members}
        if base == "loss" and names.LOSS in state.series and not splits & {None, "train", "training"}:
            members.append(names.LOSS)
        held_out = any(split in names.HELD_OUT for split in splits)
        out.append(((not held_out, base != "loss"), tuple(members)))
    return [members for _, members in sorted(out, key=lambda item: item[0])]


def metrics_reads(state: RunState) -> tuple[str, ...]:
    """The metrics panel's series: every group's (the view says which group is drawn)."""
    return tuple(name for group in metric_groups(state) for name in group)


def metrics(state: RunState, view: ChartView, reads: tuple[str, ...] | None = None) -> Panel:
    """One group of the printed metrics (the ``v`` key picks which, ``view.metric``), each in
    its colour; a validation loss over the training loss (dim, smoothed as the loss chart)."""
    groups = metric_groups(state)
    if not groups:
        return Panel(Text("no printed metric yet", "dim"), Chart())
    index = view.metric % len(groups)
    lines, parts, at = [], _cursor(view), view.cursor
    for i, name in enumerate(groups[index]):
        series = state.series[name]
        if name == names.LOSS:
            values = ema_series(series.values, 1 - view.smoothing, series.steps) if view.smoothing else series.values
            lines.insert(0, Line(series.steps, values, "grey42"))
            parts.append(_value("train loss", value_at(series.steps, values, at), "grey70"))
            continue
        style = METRIC_STYLES[i % len(METRIC_STYLES)]
        lines.append(Line(series.steps, series.values, style))
        if i < 4:
            parts.append(_value(names.parse_printed(name), value_at(series.steps, series.values, at), f"bold {style}"))
    note = [Text(f"v: {index + 1} of {len(groups)}", "dim")] if len(groups) > 1 else []
    return Panel(_join(parts), _chart(view, state, lines, "auto"), _join(note + _scale_note(view)))


def versions(state: RunState, series: tuple[str, ...]) -> tuple:
    """A cheap fingerprint of the series a panel reads, to skip redraws of unchanged data."""
    return tuple(state.series[n].version if n in state.series else -1 for n in series)


class ChartSpec(NamedTuple):
    """One Overview chart: the series it reads (``reads(state)``), and how it draws them
    (``draw(state, view, reads)``), so the list a redraw is judged by is the one drawn."""

    reads: Callable[[RunState], tuple[str, ...]]
    draw: Callable[..., Panel]


CHARTS = {"loss": ChartSpec(loss_reads, loss), "lr": ChartSpec(lr_reads, lr), "grad": ChartSpec(grad_reads, grad),
          "speed": ChartSpec(speed_reads, speed), "metrics": ChartSpec(metrics_reads, metrics)}
"""Each Overview chart by its id."""
