"""Pure dashboard state: series buffers, decimation, smoothing, rates and formatting.

Nothing here imports Textual or torch, so every function is tested on plain lists.
"""

from __future__ import annotations

import bisect
import math
import re
import time
from collections import deque
from dataclasses import dataclass, field

from ptdash.shared.decimate import decimate
from ptdash.shared.protocol import ENDED, Ack, Event, LayerNames, Layers, Metrics, Status

from .findings import Findings
from .layers import LayerStats

SERIES_CAP = 8000
"""Points a series buffer holds before it decimates itself to half of that."""

RANK_SERIES = ("loss", "time/step_s", "time/data_s", "throughput/samples_per_s", "host/rss_bytes")
"""The series kept of ranks other than 0 (the Ranks tab's columns), besides GPU memory."""

_GPU_ALLOCATED = re.compile(r"^gpu\d+/mem_allocated_bytes$")


def rank_wants(name: str) -> bool:
    """Whether the Ranks tab reads series ``name`` of every rank."""
    return name in RANK_SERIES or _GPU_ALLOCATED.match(name) is not None


# ------------------------------------------------------------------------- decimation


# ---------------------------------------------------------------------------- buffers


class Series:
    """One metric's points in step order: append-only, decimating itself when it grows.

    Live rows are appended at full resolution; when the buffer passes ``cap`` points the
    whole of it is decimated to ``cap // 2`` (min/max per bucket), so memory and drawing
    cost stay bounded on a run of a million steps while spikes survive.
    """

    def __init__(self, cap: int = SERIES_CAP) -> None:
        self.cap = cap
        self.steps: list[int] = []
        self.values: list[float | None] = []
        self.version = 0
        """Bumped on every change, so a chart redraws only when its data moved."""

    def __len__(self) -> int:
        return len(self.steps)

    @property
    def last_step(self) -> int | None:
        return self.steps[-1] if self.steps else None

    def latest(self) -> float | None:
        """The newest value (None when empty or non-finite)."""
        return self.values[-1] if self.values else None

    def extend(self, steps: list[int], values: list[float | None]) -> None:
        """Append points newer than the last one; older ones are ignored."""
        last = self.last_step
        for s, v in zip(steps, values):
            if last is None or s > last:
                self.steps.append(s)
                self.values.append(v)
                last = s
        self._settle()

    def append(self, step: int, value: float | None) -> None:
        if not self.steps or step > self.steps[-1]:
            self.steps.append(step)
            self.values.append(value)
            self._settle()

    def merge(self, steps: list[int], values: list[float | None]) -> None:
        """Insert points anywhere (a gap read back from the store); existing steps win."""
        for s, v in zip(steps, values):
            i = bisect.bisect_left(self.steps, s)
            if i < len(self.steps) and self.steps[i] == s:
                continue
            self.steps.insert(i, s)
            self.values.insert(i, v)
        self._settle()

    def _settle(self) -> None:
        if len(self.steps) > self.cap:
            self.steps, self.values = decimate(self.steps, self.values, self.cap // 2)
        self.version += 1


class StepRate:
    """Steps per second from the wall times of recent steps."""

    def __init__(self, window_s: float = 30.0, max_points: int = 256) -> None:
        self.window_s = window_s
        self._points: deque[tuple[int, float]] = deque(maxlen=max_points)

    def add(self, step: int, wall: float) -> None:
        if not self._points or step > self._points[-1][0]:
            self._points.append((step, wall))

    def rate(self) -> float | None:
        """Steps per second over the last ``window_s`` seconds of steps, None when unknown."""
        if len(self._points) < 2:
            return None
        last_step, last_wall = self._points[-1]
        first_step, first_wall = self._points[0]
        for s, w in self._points:
            if w >= last_wall - self.window_s:
                first_step, first_wall = s, w
                break
        if last_step == first_step:
            first_step, first_wall = self._points[-2]
        span = last_wall - first_wall
        return (last_step - first_step) / span if span > 0 else None


# -------------------------------------------------------------------------- run state


@dataclass
class EventLine:
    """One line of the events pane: when, at which step, what, and how loud."""

    wall: float
    step: int | None
    text: str
    level: str = "info"
    """``info``, ``ok``, ``warning``, ``error`` or ``dim``."""


@dataclass
class RunState:
    """Everything the dashboard shows, folded from the source's deliveries.

    The app owns one; widgets receive what they need of it as attributes.
    """

    info: dict = field(default_factory=dict)
    series: dict[str, Series] = field(default_factory=dict)
    status: Status | None = None
    rate: StepRate = field(default_factory=StepRate)
    events: list[EventLine] = field(default_factory=list)
    connected: bool = False
    connection_note: str = "connecting…"
    first_wall: float | None = None
    last_wall: float | None = None
    seen_commands: set[str] = field(default_factory=set)
    layers: LayerStats = field(default_factory=LayerStats)
    profile: dict | None = None
    """The data of the latest ``profile`` event: steps, device, top ops, trace, error."""
    profile_pending: str | None = None
    """What is being profiled (``profiling steps 41-45``) between the request and its report."""
    profile_note: str | None = None
    """Why the latest profile request came to nothing (refused), shown above the last report."""
    oom: dict | None = None
    """The data of the latest ``oom`` event: error, remedies, allocator summary."""
    hint: str | None = None
    """The latest ``hint`` (input-bound advice), shown under the step-time breakdown."""
    pause_reason: str | None = None
    """Why the engine paused the run by itself (an anomaly), until it runs again."""
    findings: Findings = field(default_factory=Findings)
    """The training doctor's findings (``finding`` events), one per rule."""
    world_size: int = 1
    """Ranks of the run: the most that run.json, the store, the engine or the rows said."""
    rank_series: dict[int, dict[str, Series]] = field(default_factory=dict)
    """Per rank, its series (``RANK_SERIES`` for ranks above 0); rank 0's is ``series`` itself."""
    stalled: dict[int, int] = field(default_factory=dict)
    """Rank -> the step it stalled at (an ``anomaly`` event); it counts until the rank steps again."""
    rank_failures: dict[int, int] = field(default_factory=dict)
    """Rank -> exit code of the ranks that failed, the first being the cause (run.json's ``rank_failures``)."""

    def __post_init__(self) -> None:
        self.rank_series[0] = self.series
        self.note_info(self.info)

    @property
    def ended(self) -> bool:
        return self.status is not None and self.status.state in ENDED

    def get(self, name: str) -> Series:
        """The series called ``name``, created empty when new."""
        series = self.series.get(name)
        if series is None:
            series = self.series[name] = Series()
        return series

    def rank_get(self, rank: int, name: str) -> Series:
        """Series ``name`` of ``rank``, created empty when new (rank 0: ``get``)."""
        if rank == 0:
            return self.get(name)
        self.note_world_size(rank + 1)
        own = self.rank_series.setdefault(rank, {})
        series = own.get(name)
        if series is None:
            series = own[name] = Series()
        return series

    def rank_step(self, rank: int) -> int | None:
        """The newest step ``rank`` recorded, None before its first."""
        return max((s.last_step for s in self.rank_series.get(rank, {}).values() if s.last_step is not None),
                   default=None)

    def note_world_size(self, size: object) -> None:
        if isinstance(size, int) and not isinstance(size, bool) and size > self.world_size:
            self.world_size = size

    def note_info(self, info: dict) -> None:
        """Take what run.json says about the ranks: how many, and which failed how."""
        self.note_world_size(info.get("world_size"))
        self._note_failures(info.get("rank_failures"))

    def _note_failures(self, failures: object) -> None:
        if not isinstance(failures, list):
            return
        for failure in failures:
            if isinstance(failure, dict) and isinstance(failure.get("rank"), int):
                self.rank_failures.setdefault(failure["rank"], failure.get("exitcode"))
                self.note_world_size(failure["rank"] + 1)

    def add_walls(self, steps: list[int], walls: list[float]) -> None:
        for s, w in zip(steps, walls):
            self.rate.add(s, w)
        if walls:
            self.first_wall = walls[0] if self.first_wall is None else min(self.first_wall, walls[0])
            self.last_wall = walls[-1] if self.last_wall is None else max(self.last_wall, walls[-1])

    def add_metrics(self, msg: Metrics) -> None:
        """Fold one live batch in: rank 0's feeds the charts, other ranks' only the Ranks tab."""
        if msg.rank != 0:
            self._add_rank_rows(msg.rank, msg.rows)
            return
        columns: dict[str, tuple[list[int], list[float | None]]] = {}
        steps, walls = [], []
        for step, wall, values in msg.rows:
            steps.append(step)
            walls.append(wall)
            for name, value in values.items():
                col = columns.setdefault(name, ([], []))
                col[0].append(step)
                col[1].append(value)
        for name, (s, v) in columns.items():
            self.get(name).extend(s, v)
        self.add_walls(steps, walls)

    def _add_rank_rows(self, rank: int, rows: list) -> None:
        columns: dict[str, tuple[list[int], list[float | None]]] = {}
        for step, _, values in rows:
            for name, value in values.items():
                if rank_wants(name):
                    col = columns.setdefault(name, ([], []))
                    col[0].append(step)
                    col[1].append(value)
        self.note_world_size(rank + 1)
        for name, (s, v) in columns.items():
            self.rank_get(rank, name).extend(s, v)

    def add_layer_names(self, msg: LayerNames) -> None:
        """Take the parameter names the per-parameter records follow (rank 0's)."""
        if msg.rank == 0:
            self.layers.set_names(msg)

    def add_layers(self, msg: Layers) -> None:
        """Fold per-parameter gradient statistics in (rank 0, like the charts)."""
        if msg.rank == 0:
            self.layers.add(msg)

    def set_status(self, status: Status) -> None:
        """Take a new status; a run that leaves its pause is no longer paused by an anomaly."""
        if self.status is not None and self.status.state == "paused" and status.state != "paused":
            self.pause_reason = None
        self.status = status

    def add_ack(self, ack: Ack, command_text: str) -> EventLine:
        """Record an ack; ``command_text`` says what the command was ("clip 0.5")."""
        self.seen_commands.add(ack.id)
        if ack.name == "profile" and ack.ok:
            self.profile_pending = f"{ack.message}…" if ack.message else self.profile_pending
        elif ack.name == "profile":
            self.profile_pending, self.profile_note = None, f"profile refused: {ack.message}"
        if ack.ok:
            where = f"step {ack.step} " if ack.step is not None else ""
            line = EventLine(time.time(), ack.step, f"{where}{command_text} applied", "ok")
        else:
            line = EventLine(time.time(), ack.step, f"{command_text} refused: {ack.message}", "error")
        self.events.append(line)
        return line

    def note_event(self, event: Event) -> None:
        """Keep what the tabs show of an event that gets no line in the events pane (older history)."""
        self._note(event)

    def add_event(self, event: Event) -> EventLine | None:
        """Record an engine event; a command event already shown by its ack is skipped."""
        kind, message, data, step, wall = event.kind, event.message, event.data, event.step, event.wall
        self._note(event)
        command_id = data.get("id")
        if kind == "command" and command_id is not None:
            if command_id in self.seen_commands:
                return None
            self.seen_commands.add(command_id)
        level = EVENT_LEVELS.get(kind, "info")
        if (kind == "command" and data.get("ok") is False) or (kind == "profile" and data.get("error")):
            level = "error"
        where = f"step {step} " if step is not None else ""
        if event.rank:
            where += f"rank {event.rank} "
        what = f"⚑ doctor: {message}" if kind == "finding" else f"{kind}: {message}"
        line = EventLine(wall or time.time(), step, f"{where}{what}", level)
        self.events.append(line)
        return line

    def _note(self, event: Event) -> None:
        """Keep what the tabs and the header show of an event."""
        kind, message, data, step = event.kind, event.message, event.data, event.step
        if kind == "finding":
            self.findings.add(event)
        elif kind == "anomaly" and isinstance(data.get("stalled_rank"), int):
            rank = data["stalled_rank"]
            at = data.get("step")
            self.stalled[rank] = at if isinstance(at, int) else (step or 0)
            self.note_world_size(rank + 1)
        elif kind == "run":
            self._note_failures(data.get("failures"))
        elif kind == "profile":
            self.profile, self.profile_pending, self.profile_note = data, None, None
        elif kind == "command" and data.get("name") == "profile" and data.get("ok"):
            self.profile_pending = f"{message.partition(': ')[2] or 'profiling'}…"
        elif kind == "oom":
            self.oom = data
        elif kind == "hint":
            self.hint = message
        elif kind == "anomaly" and data.get("action") == "pause":
            self.pause_reason = f"non-finite gradient in {data.get('layer') or 'the loss'}"


EVENT_LEVELS = {"anomaly": "error", "oom": "error", "warning": "warning", "hint": "warning", "checkpoint": "ok",
                "finding": "finding"}
"""How loud each event kind is in the events pane (a doctor's finding has a look of its own)."""

# ------------------------------------------------------------------------- formatting


def fmt_duration(seconds: float | None) -> str:
    """``45s``, ``3m05s``, ``1h02m``, ``2d03h``; an em dash when unknown."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "—"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m}m{s:02d}s"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h}h{m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d{h:02d}h"


_SI = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def fmt_si(value: float | None, digits: int = 3) -> str:
    """A compact number: ``950``, ``12.3k``, ``1.23M``, ``0.0123``, ``3e-4``; N/A for None.

    Large magnitudes get SI prefixes; small ones (below 0.01) a short exponent, which is
    how learning rates are usually written.
    """
    if value is None:
        return "N/A"
    if not math.isfinite(value):
        return str(value)
    mag = abs(value)
    for scale, prefix in _SI:
        if mag >= scale * 0.9995:
            return f"{value / scale:.{digits}g}{prefix}"
    if mag >= 1:
        # Never fall into exponent form for the integer digits: 100, not 1e+02.
        return f"{value:.{max(digits, int(math.log10(mag)) + 1)}g}"
    if mag == 0 or mag >= 0.01:
        return f"{value:.{digits}g}"
    mantissa, exponent = f"{value:.{digits - 1}e}".split("e")
    mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa}e{int(exponent)}"


def fmt_bytes(n: float | None) -> str:
    """``512 B``, ``1.5 KiB``, ``3.2 GiB``; N/A for None."""
    if n is None:
        return "N/A"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def eta(steps_done: int | None, total: int | None, steps_per_s: float | None) -> float | None:
    """Seconds until ``total`` steps at the current rate; None when it cannot be known."""
    if steps_done is None or not total or not steps_per_s or steps_per_s <= 0:
        return None
    return max(0, total - steps_done) / steps_per_s


def command_text(name: str, value: float | None) -> str:
    """How a command reads in the events pane: ``clip 0.5``, ``LR ×0.5``, ``profile 5 steps``."""
    if name == "clip":
        return "clip off" if value is None else f"clip {fmt_si(value)}"
    if name == "lr_scale":
        return f"LR ×{fmt_si(value)}"
    if name == "profile":
        return f"profile {int(value or 0)} steps"
    return name
