"""What each Overview chart shows: pure functions from RunState to (legend, Chart).

No Textual here; the ChartPanel widget only draws what these return, so the choice of
series, colours and summary numbers is tested without an app.
"""

from __future__ import annotations

import re

from rich.text import Text

from ptdash.shared.numbers import ema_series

from ..chart import Chart, Line
from ..fmt import fmt_si
from ..state import RunState

LOSS_ALPHA = 0.05
"""EMA weight of each new loss value in the smoothed line."""

CLIPPED_WINDOW = 100
"""Recent steps over which the share of clipped steps is reported."""

PALETTE = ("green", "cyan", "magenta", "yellow", "bright_blue", "red")

_LR = re.compile(r"^opt(\d*)/lr/group(\d+)$")


def _value(label: str, value: float | None, style: str, digits: int = 4) -> Text:
    return Text.assemble((f"{label} " if label else "", "dim"), (fmt_si(value, digits), style))


def _join(parts: list[Text]) -> Text:
    return Text("  ").join(parts)


def _others(state: RunState, suffix: str) -> list[tuple[str, str]]:
    """``(series name, label)`` of the other optimizers' ``opt<k>/<suffix>`` series."""
    found = sorted((int(m.group(1)), n) for n in state.series if (m := re.match(rf"^opt(\d+)/{suffix}$", n)))
    return [(n, state.optimizers.get(k) or f"opt{k}") for k, n in found]


def loss(state: RunState) -> tuple[Text, Chart]:
    """Raw loss (dim) under its EMA (bright); log scale once it spans decades. The other
    optimizers' losses (a GAN's generator) in their own colours."""
    series = state.series.get("loss")
    if series is None or not series.steps:
        if state.no_step:
            return Text(f"no step found: {state.no_step}", "yellow"), Chart()
        return Text("no loss yet", "dim"), Chart()
    smooth = ema_series(series.values, LOSS_ALPHA, series.steps)
    last_smooth = next((v for v in reversed(smooth) if v is not None), None)
    legend = _join([_value("", series.latest(), "bold"), _value("ema", last_smooth, "bold bright_cyan")])
    if series.latest() is None:
        legend.append("  non-finite", "bold red")
    lines = [Line(series.steps, series.values, "grey50"), Line(series.steps, smooth, "bright_cyan")]
    for i, (name, label) in enumerate(_others(state, "loss")):
        other = state.series[name]
        style = PALETTE[(i + 2) % len(PALETTE)]
        lines.append(Line(other.steps, ema_series(other.values, LOSS_ALPHA, other.steps), style))
        legend.append("  ")
        legend.append_text(_value(label, other.latest(), style))
    return legend, Chart(lines, log_y="auto")


def lr_names(names) -> list[str]:
    """The LR series, main optimizer first, then by group number."""
    found = [(int(m.group(1) or -1), int(m.group(2)), n) for n in names if (m := _LR.match(n))]
    return [n for *_, n in sorted(found)]


def lr(state: RunState) -> tuple[Text, Chart]:
    """Effective LR of every param group of every optimizer, one colour each."""
    names = lr_names(state.series)
    if not names and "user/lr" in state.series:
        names = ["user/lr"]  # the script reports its own LR with ptdash.log(lr=...)
    if not names:
        if "loss" in state.series and not state.optimizers and "grad/norm_total" in state.series:
            return Text("LR unknown: no torch.optim optimizer (ptdash.log(lr=...) reports one)", "dim"), Chart()
        return Text("no LR yet", "dim"), Chart()
    lines, parts = [], []
    scale = state.status.lr_scale if state.status is not None else 1.0
    if scale != 1.0:
        parts.append(Text(f"×{fmt_si(scale)}", "bold yellow"))
    for i, name in enumerate(names):
        series = state.series[name]
        style = PALETTE[i % len(PALETTE)]
        lines.append(Line(series.steps, series.values, style))
        label = "" if len(names) == 1 else _lr_label(state, name)
        if i < 4:
            parts.append(_value(label, series.latest(), style, 3))
    if len(names) > 4:
        parts.append(Text(f"+{len(names) - 4}", "dim"))
    return _join(parts), Chart(lines)


def _lr_label(state: RunState, name: str) -> str:
    """``g0`` for the main optimizer's group 0, ``Generator g0`` for another optimizer's."""
    m = _LR.match(name)
    if m is None:
        return name
    k, group = m.group(1), m.group(2)
    return f"g{group}" if not k else f"{state.optimizers.get(int(k)) or 'opt' + k} g{group}"


def grad(state: RunState) -> tuple[Text, Chart]:
    """Pre-clip total gradient norm, with the clip threshold in effect as a dashed line."""
    norm = state.series.get("grad/norm_total")
    if norm is None or not norm.steps:
        return Text("no gradients yet", "dim"), Chart()
    lines = [Line(norm.steps, norm.values, "magenta")]
    parts = [_value("", norm.latest(), "bold magenta")]
    clip = state.series.get("grad/clip_max")
    if clip is not None and clip.steps:
        lines.append(Line(clip.steps, clip.values, "red", dashed=True))
        if clip.last_step == norm.last_step:
            parts.append(_value("clip", clip.latest(), "red"))
    clipped = state.series.get("grad/clipped")
    if clipped is not None and clipped.steps:
        recent = [v for v in clipped.values[-CLIPPED_WINDOW:] if v is not None]
        if recent and any(recent):
            parts.append(Text.assemble(("clipped ", "dim"), (f"{100 * sum(recent) / len(recent):.0f}%", "red")))
    for i, (name, label) in enumerate(_others(state, "grad/norm_total")):
        other = state.series[name]
        style = PALETTE[(i + 3) % len(PALETTE)]
        lines.append(Line(other.steps, other.values, style))
        parts.append(_value(label, other.latest(), style))
    return _join(parts), Chart(lines, log_y="auto")


def speed(state: RunState) -> tuple[Text, Chart]:
    """Samples/s when the engine knows the batch size, else seconds per step."""
    samples = state.series.get("throughput/samples_per_s")
    step_s = state.series.get("time/step_s")
    if samples is not None and samples.steps:
        legend = _value("", samples.latest(), "bold green", 3)
        legend.append(" samples/s", "dim")
        smooth = ema_series(samples.values, LOSS_ALPHA, samples.steps)
        return legend, Chart([Line(samples.steps, samples.values, "green4"),
                              Line(samples.steps, smooth, "bright_green")])
    if step_s is not None and step_s.steps:
        legend = _value("", step_s.latest(), "bold green")
        legend.append(" s/step", "dim")
        return legend, Chart([Line(step_s.steps, step_s.values, "green")], log_y="auto")
    return Text("no timings yet", "dim"), Chart()


def versions(state: RunState, names: tuple[str, ...]) -> tuple:
    """A cheap fingerprint of the series a panel reads, to skip redraws of unchanged data."""
    return tuple(state.series[n].version if n in state.series else -1 for n in names)
