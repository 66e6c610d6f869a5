"""What the System tab shows: host and GPU readings, the step-time split, the last OOM.

Pure functions from RunState to Rich renderables (no Textual), tested without an app.
Every reading may be missing (no NVML, no CUDA yet, an old engine): it then reads "N/A".
"""

from __future__ import annotations

import statistics

from rich.console import Group, RenderableType
from rich.padding import Padding
from rich.text import Text

from ptdash.shared import names

from ..bars import bar, sparkline, stacked
from ..fmt import fmt_bytes, fmt_ms
from ..state import RunState

SPARK_WIDTH = 20
"""Samples in each sparkline (the engine samples the system about once a second)."""

STEP_WINDOW = 50
"""Recent sampled steps whose split makes the step-time split."""

LABEL = 12

K_MAX = 256
"""The engine's sparsest sampling (one step in this many; ptdash.budget.K_MAX, which this side cannot import)."""

STEP_PARTS = (
    (names.DATA_S, "data", "yellow"),
    (names.COMPUTE_S, "forward+backward", "cyan"),
    (names.OPTIM_S, "optimizer", "magenta"),
    (names.OTHER_S, "other", "white"),
)
"""(series, label, colour) of each part of a step, in the order a step spends them."""


def latest(state: RunState, name: str) -> float | None:
    """The newest host or GPU reading; None when it is missing or N/A."""
    series = state.sample(name)
    return series.latest() if series is not None else None


def recent(state: RunState, name: str, n: int = SPARK_WIDTH) -> list[float | None]:
    """The latest ``n`` readings (taken once a second, whatever the step time)."""
    series = state.sample(name)
    return series.values[-n:] if series is not None else []


def gpu_indices(state: RunState) -> list[int]:
    """The GPUs the engine reports on, by CUDA index."""
    return sorted({found[0] for name in state.samples.get(0, {}) if (found := names.parse_gpu(name)) is not None})


def _pct(value: float | None) -> str:
    return "N/A" if value is None else f"{value:.0f}%"


def _line(label: str, *parts) -> Text:
    return Text.assemble((f" {label:<{LABEL}}", "bold"), *parts, no_wrap=True, overflow="ellipsis")


def _note(text: str, style: str, indent: int = 1) -> Padding:
    """A line that may wrap, each wrapped line indented like the first."""
    return Padding(Text(text, style), (0, 0, 0, indent))


def _spark(state: RunState, name: str, style: str = "cyan") -> Text:
    values = recent(state, name)
    return sparkline(values, SPARK_WIDTH, style) if any(v is not None for v in values) else Text("")


def _frac(part: float | None, whole: float | None) -> float | None:
    return part / whole if part is not None and whole else None


# -------------------------------------------------------------------------- host


def host(state: RunState, width: int) -> list[RenderableType]:
    """Machine and engine CPU, the processes' memory and the machine's memory."""
    bar_w = max(8, min(30, width - LABEL - SPARK_WIDTH - 24))
    cpu = latest(state, names.HOST_CPU_PCT)
    proc = latest(state, names.HOST_PROC_CPU_PCT)
    workers_cpu = latest(state, names.HOST_WORKERS_CPU_PCT)
    workers = latest(state, names.HOST_WORKERS)
    used, total = latest(state, names.HOST_MEM_USED), latest(state, names.HOST_MEM_TOTAL)
    lines = [Text(" host", "bold underline")]
    lines.append(_line("CPU machine", bar(_frac(cpu, 100.0), bar_w, "green"), f" {_pct(cpu):>5}  ",
                       _spark(state, names.HOST_CPU_PCT, "green")))
    cores = f" ({proc / 100:.1f} cores)" if proc is not None else ""
    engine = _line("CPU engine", (_pct(proc), "bold"), cores, "  ", _spark(state, names.HOST_PROC_CPU_PCT, "cyan"))
    if workers:
        engine.append(f"  workers {_pct(workers_cpu)} ({int(workers)})")
    lines.append(engine)
    lines.append(_line("memory", bar(_frac(used, total), bar_w, "blue"),
                       f" {fmt_bytes(used)} / {fmt_bytes(total)}  ", _spark(state, names.HOST_MEM_USED, "blue")))
    rss = _line("RSS", ("engine ", "dim"), (fmt_bytes(latest(state, names.HOST_RSS)), "bold"), "  ",
                _spark(state, names.HOST_RSS, "blue"))
    if workers:
        rss.append("  workers ", "dim")
        rss.append(fmt_bytes(latest(state, names.HOST_WORKERS_RSS)), "bold")
    lines.append(rss)
    return lines


# --------------------------------------------------------------------------- GPUs


def gpu(state: RunState, i: int, width: int) -> list[RenderableType]:
    """One GPU: allocator memory against NVML's view, utilisation, heat, power, clocks."""
    def get(metric: str) -> float | None:
        return latest(state, names.gpu(i, metric))

    bar_w = max(8, min(40, width - LABEL - 48))
    allocated, reserved, peak = get("mem_allocated_bytes"), get("mem_reserved_bytes"), get("mem_peak_bytes")
    used, total = get("nvml_mem_used_bytes"), get("nvml_mem_total_bytes")
    lines = [Text(f" gpu{i}", "bold underline")]
    if total:
        # Allocated inside reserved inside what NVML sees in use (other processes included).
        parts = [(_frac(allocated, total), "green"),
                 (_frac(max(0.0, (reserved or 0) - (allocated or 0)), total), "dark_green"),
                 (_frac(max(0.0, (used or 0) - max(reserved or 0, allocated or 0)), total), "grey50")]
        mem_bar = stacked(parts, bar_w)
    else:
        mem_bar = Text("N/A".ljust(bar_w), "dim")
    lines.append(_line("memory", mem_bar, f" {fmt_bytes(used)} / {fmt_bytes(total)}",
                       ("  this process ", "dim"), fmt_bytes(get("proc_mem_bytes"))))
    lines.append(_line("", ("allocated ", "green"), (fmt_bytes(allocated), "bold"),
                       ("  reserved ", "dark_green"), (fmt_bytes(reserved), "bold"),
                       ("  peak ", "dim"), (fmt_bytes(peak), "bold")))
    util = get("nvml_util_pct")
    lines.append(_line("util", bar(_frac(util, 100.0), min(bar_w, 20), "green"), f" {_pct(util):>5}  ",
                       _spark(state, names.gpu(i, "nvml_util_pct"), "green")))
    temp, power, limit = get("temperature_c"), get("power_w"), get("power_limit_w")
    sm, mem = get("sm_clock_mhz"), get("mem_clock_mhz")
    lines.append(_line("sensors", ("temp ", "dim"), "N/A" if temp is None else f"{temp:.0f}°C",
                       ("  power ", "dim"), "N/A" if power is None else f"{power:.0f}",
                       f" / {'N/A' if limit is None else f'{limit:.0f}'} W",
                       ("  clocks ", "dim"), f"SM {'N/A' if sm is None else f'{sm:.0f}'} MHz",
                       f", mem {'N/A' if mem is None else f'{mem:.0f}'} MHz"))
    retries, ooms = get("alloc_retries"), get("ooms")
    allocator = _line("allocator", ("retries ", "dim"), "N/A" if retries is None else f"{retries:.0f}",
                      ("  OOMs ", "dim"), ("N/A" if ooms is None else f"{ooms:.0f}", "bold red" if ooms else ""))
    lines.append(allocator)
    if retries:
        lines.append(_note(f"fragmentation: the allocator freed its cache and retried {retries:.0f} time(s); "
                           "try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", "yellow", LABEL + 1))
    return lines


# ---------------------------------------------------------------------- step time


def step_split(state: RunState, window: int = STEP_WINDOW) -> dict[str, float | None]:
    """Where a typical step's time goes: each part's mean over the same recent sampled steps.

    The engine splits sampled steps only. Means over one set of steps add up to its mean
    step time; a step over three times the median (a checkpoint, an evaluation) is left
    out so one slow step does not move the picture. Without any split, ``time/step_s`` is
    the median of the recent steps.
    """
    steps = state.series.get(names.STEP_S)
    out: dict[str, float | None] = dict.fromkeys((*(n for n, _, _ in STEP_PARTS), names.STEP_S))
    if steps is None or not steps.values:
        return out
    recent_steps = [v for v in steps.values[-window:] if v is not None]
    out[names.STEP_S] = statistics.median(recent_steps) if recent_steps else None
    parts = {name: state.series.get(name) for name, _, _ in STEP_PARTS}
    compute = parts[names.COMPUTE_S]
    if compute is None or not compute.steps:
        data = parts[names.DATA_S]
        if data is not None and data.values and data.values[-1] is not None:
            out[names.DATA_S] = data.values[-1]
        return out
    sampled = []
    for step in compute.steps[-window:]:
        total = steps.value_at(step)
        values = {name: (s.value_at(step) if s is not None else None) for name, s in parts.items()}
        if total is not None and values[names.COMPUTE_S] is not None:
            sampled.append((total, values))
    if not sampled:
        return out
    typical = statistics.median(t for t, _ in sampled)
    kept = [(t, v) for t, v in sampled if t <= 3 * typical] or sampled
    out[names.STEP_S] = sum(t for t, _ in kept) / len(kept)
    for name in parts:
        out[name] = sum(v[name] or 0.0 for _, v in kept) / len(kept)
    return out


def step_time(state: RunState, width: int) -> list[RenderableType]:
    """Where a step's time goes (data wait, forward+backward, optimizer), and any hint."""
    split = step_split(state)
    step = split[names.STEP_S]
    # The engine splits sampled steps only: the parts are means over the same sampled steps.
    lines: list[RenderableType] = [Text(f" step time  (the last {STEP_WINDOW} sampled steps: each part's share adds "
                                        "up to the step)", "bold underline")]
    if all(v is None for v in split.values()):
        lines.append(Text(" no step timings yet", "dim"))
    elif all(split[n] is None for n, _, _ in STEP_PARTS):
        lines.append(Text.assemble((" step ", "dim"), (fmt_ms(step), "bold"),
                                   (" (no data / forward+backward / optimizer / other split recorded)", "dim")))
    else:
        whole = step or sum(v for v in split.values() if v is not None) or None
        bar_w = max(10, min(60, width - 20))
        lines.append(Text.assemble(" ", stacked([(_frac(split[n], whole), style) for n, _, style in STEP_PARTS], bar_w),
                                   ("  step ", "dim"), (fmt_ms(step), "bold")))
        for name, label, style in STEP_PARTS:
            share = _frac(split[name], whole)
            lines.append(Text.assemble((" ■ ", style), (f"{label:<17}", "dim"), (f"{fmt_ms(split[name]):>9}", "bold"),
                                       (f"  {share:4.0%}" if share is not None else "", "dim")))
    if state.hint:
        lines.append(_note(f"hint: {state.hint}", "yellow"))
    return lines


# -------------------------------------------------------------------- ptdash's cost


def cost_line(step_pct: float | None, threads_pct: float | None, budget_pct: float | None) -> str | None:
    """"ptdash: 0.4% of step time ..." from the engine's own measure (budget.py); None without one."""
    if step_pct is None and threads_pct is None:
        return None
    said = "ptdash: " + ("N/A" if step_pct is None else f"{_percent(step_pct)} of step time")
    if budget_pct is not None:
        said += f" (budget {budget_pct:g}%)"
    if threads_pct is not None:
        said += f", its threads {_percent(threads_pct)} of a core"
    return said


def _percent(value: float) -> str:
    """``0.4%``; a cost too small for one decimal is ``<0.1%``, not a ``0.0%`` that reads as none."""
    return "<0.1%" if 0 < value < 0.05 else f"{value:.1f}%"


def sampling_line(layers_every: float | None, doctor_every: float | None) -> str | None:
    """Which series are sampled and how often; None when the engine did not say."""
    if layers_every is None:
        return None
    k = int(layers_every)
    said = ("not thinned: every step sampled (total and per-layer norms; update ratios every "
            "--update-ratio-every)" if k <= 1 else
            f"sampled to stay within the budget: per-layer norms (and the total norm, unless the script "
            f"clips) one step in {k}")
    if doctor_every is not None:
        said += f"; doctor checks and the step split one step in {int(doctor_every)}"
    return said


KEPT = {"steps": names.KEPT_STEPS, "norm": names.KEPT_NORM, "layers": names.KEPT_LAYERS,
        "ratios": names.KEPT_RATIOS}
"""What the engine counts it kept (budget.py), by the keys ``kept_line`` reads."""


def kept_counts(state: RunState) -> dict[str, int] | None:
    """The engine's newest counts of what it kept (steps, and of them with a total norm,
    per-layer norms, update ratios); None from an engine that does not count."""
    values = {key: latest(state, name) for key, name in KEPT.items()}
    if values["steps"] is None:
        return None
    return {key: int(value or 0) for key, value in values.items()}


def kept_line(kept: dict | None) -> str | None:
    """``kept: total grad norm at 150 of 150 steps, per-layer norms at 9, update ratios at 1``:
    what was kept, as counts (never "every step" where it was not); None without a step."""
    if not kept or not kept.get("steps"):
        return None
    return (f"kept: total grad norm at {kept['norm']:,} of {kept['steps']:,} steps, per-layer norms at "
            f"{kept['layers']:,}, update ratios at {kept['ratios']:,}")


def cost(state: RunState) -> list[RenderableType]:
    """ptdash's own cost, as the engine measures it, and what it samples to stay within its budget."""
    head = cost_line(latest(state, names.STEP_PCT), latest(state, names.THREADS_PCT),
                     latest(state, names.BUDGET_PCT))
    if head is None:
        return []
    every = latest(state, names.LAYERS_EVERY)
    lines: list[RenderableType] = [Text(" ptdash's own cost", "bold underline"), Text(f" {head}")]
    sampled = sampling_line(every, latest(state, names.DOCTOR_EVERY))
    if sampled:
        lines.append(_note(sampled, "yellow" if every and every > 1 else "dim"))
    kept = kept_line(kept_counts(state))
    if kept:
        lines.append(_note(f"{kept} (this engine process)", "dim"))
    share, budget = latest(state, names.STEP_PCT), latest(state, names.BUDGET_PCT)
    if share is not None and budget is not None and share > budget and every is not None and every >= K_MAX:
        lines.append(_note("over the budget at the sparsest sampling: what ptdash keeps every step (step count, "
                           "loss, LRs, step time, commands) costs more than the budget on steps this short", "yellow"))
    return lines


# ---------------------------------------------------------------------------- OOM


def oom(state: RunState) -> list[RenderableType]:
    """The latest out-of-memory report: the error and what to try."""
    report = state.oom
    if report is None:
        return []
    lines: list[RenderableType] = [Text(" out of memory", "bold red underline"),
                                   _note(report.error or "CUDA out of memory", "red")]
    for i, remedy in enumerate(report.remedies, 1):
        lines.append(_note(f"{i}. {remedy}", ""))
    if report.snapshot:
        lines.append(_note(f"memory snapshot: {report.snapshot} (open it at pytorch.org/memory_viz)", "dim"))
    return lines


def report(state: RunState, width: int) -> RenderableType:
    """The whole System tab."""
    lines = host(state, width)
    indices = gpu_indices(state)
    lines.append(Text(""))
    if indices:
        for i in indices:
            lines += gpu(state, i, width) + [Text("")]
    else:
        lines += [Text(" no CUDA device", "dim"), Text("")]
    lines += step_time(state, width)
    spent = cost(state)
    if spent:
        lines += [Text("")] + spent
    if state.oom:
        lines += [Text("")] + oom(state)
    return Group(*lines)


def versions(state: RunState) -> tuple:
    """A cheap fingerprint of everything ``report`` reads, to skip unchanged redraws."""
    return (tuple((n, s.version) for n, s in state.series.items() if n in names.TIMES),
            tuple((n, s.version) for n, s in state.samples.get(0, {}).items()), state.hint, id(state.oom))

