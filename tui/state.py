"""Everything the dashboard shows, folded from the source's deliveries: ``RunState``.

The app owns one RunState and hands the tabs and widgets what they need of it. Pure:
nothing here imports Textual or torch, so the folding is tested on plain messages.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ptdash.shared.config import RunInfo
from ptdash.shared.protocol import ENDED, Ack, Event, LayerNames, Layers, Metrics, Samples, Status

from .series import Series, StepRate, rank_wants
from .tabs.doctor import Findings
from .tabs.layers import LayerStats


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

    info: RunInfo | None = None
    """run.json as last read (None until it could be)."""
    series: dict[str, Series] = field(default_factory=dict)
    status: Status | None = None
    rate: StepRate = field(default_factory=StepRate)
    events: list[EventLine] = field(default_factory=list)
    connected: bool = False
    connection_note: str = "connecting…"
    first_wall: float | None = None
    last_wall: float | None = None
    clock: Series = field(default_factory=Series)
    """Wall time (value) of rank 0's steps as they were delivered, to draw the run by time."""
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
    samples: dict[int, dict[str, Series]] = field(default_factory=dict)
    """Per rank, the readings taken by time (host, GPU), keyed by wall time."""
    optimizers: dict[int, str] = field(default_factory=dict)
    """Optimizer index (its series are ``opt<k>/...``) -> the model it updates."""
    no_step: str | None = None
    """Why no step can be found, when backwards run without one (the engine says so once)."""
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
        if self.info is not None:
            self.note_info(self.info)

    @property
    def ended(self) -> bool:
        """Whether the run has finished, stopped or crashed."""
        return self.status is not None and self.status.state in ENDED

    @property
    def started_at(self) -> float | None:
        """When the run started, for elapsed time: run.json's start (or creation), else its first step's wall."""
        info = self.info
        return (info.started or info.created if info is not None else None) or self.first_wall

    @property
    def ended_at(self) -> float | None:
        """When the run ended as run.json says, else its newest step's wall time."""
        return (self.info.ended if self.info is not None else None) or self.last_wall

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

    def note_info(self, info: RunInfo) -> None:
        """Take what run.json says about the ranks: how many, and which failed how."""
        self.note_world_size(info.world_size)
        self._note_failures(info.rank_failures)

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
        self.clock.extend(steps, walls)
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

    def sample(self, name: str, rank: int = 0) -> Series | None:
        """A series of readings taken by time (``host/...``, ``gpu<i>/...``) of ``rank``."""
        return self.samples.get(rank, {}).get(name)

    def add_samples(self, msg: Samples) -> None:
        """Fold in host and GPU readings (keyed by their wall time)."""
        own = self.samples.setdefault(msg.rank, {})
        if msg.rank:
            self.note_world_size(msg.rank + 1)
        for wall, values in msg.rows:
            for name, value in values.items():
                series = own.get(name)
                if series is None:
                    series = own[name] = Series()
                series.append(wall, value)

    def merge_samples(self, rank: int, named: dict[str, tuple[list[float], list[float | None]]]) -> None:
        """Readings read back from the store (history, or a gap filled)."""
        own = self.samples.setdefault(rank, {})
        for name, (walls, values) in named.items():
            own.setdefault(name, Series()).merge(walls, values)

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
            if data.get("id") == "no-step":
                self.no_step = str(data.get("what") or message)
        elif kind == "anomaly" and isinstance(data.get("stalled_rank"), int):
            rank = data["stalled_rank"]
            at = data.get("step")
            self.stalled[rank] = at if isinstance(at, int) else (step or 0)
            self.note_world_size(rank + 1)
        elif kind == "run":
            self._note_failures(data.get("failures"))
            if isinstance(data.get("optimizer"), int):
                self.optimizers[data["optimizer"]] = str(data.get("name") or data.get("class") or "")

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
