"""Everything the dashboard shows, folded from the source's deliveries: ``RunState``.

The app owns one RunState and hands the tabs and widgets what they need of it. Pure:
nothing here imports Textual or torch, so the folding is tested on plain messages.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ptdash.shared import events
from ptdash.shared.config import RunInfo
from ptdash.shared.protocol import ENDED, Ack, Event, LayerNames, Layers, Metrics, Samples, Schedule, Status

from .eventline import EVENT_LEVELS, EventLine
from .findings import Findings
from .incidents import Incidents
from .printedline import PrintedLine
from .series import Series, StepRate, rank_wants
from .tabs.layers import LayerStats


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
    profile: events.Profile | None = None
    """The latest profile's report: steps, device, top ops, trace, error."""
    profile_pending: str | None = None
    """What is being profiled (``profiling steps 41-45``) between the request and its report."""
    profile_note: str | None = None
    """Why the latest profile request came to nothing (refused), shown above the last report."""
    oom: events.Oom | None = None
    """The latest out-of-memory report: error, remedies, allocator summary."""
    hint: str | None = None  # the latest ``hint`` (input-bound advice), under the step-time breakdown
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
    """Rank -> the step it stalled at (a ``stall`` event); it counts until the rank steps again."""
    rank_failures: dict[int, int] = field(default_factory=dict)
    """Rank -> exit code of the ranks that failed, the first being the cause (run.json's ``rank_failures``)."""
    hosts: dict[int, str] = field(default_factory=dict)
    """Rank -> the host it runs on (run.json's ``hosts``, once every rank reached the hub)."""
    schedule: Schedule | None = None
    """The LR schedule ahead, or the note saying why there is none (None before the engine said)."""
    events_changed: bool = False
    """A line already in ``events`` changed or went (the pane must redraw them); the app resets it."""
    stacks: tuple[str, tuple] | None = None
    """The newest ranks' stacks the Ranks tab shows: (when, its RankStacks), asked for or a stall's."""
    incidents: Incidents = field(default_factory=Incidents)
    """Every anomaly and what was done about it (rollbacks, skips, pauses), for the Doctor tab."""
    printed: PrintedLine = field(default_factory=PrintedLine)
    """The metrics read from the script's output: one line of the events pane for all of them."""

    def __post_init__(self) -> None:
        self.rank_series[0] = self.series
        if self.info is not None:
            self.note_info(self.info)

    @property
    def ended(self) -> bool:
        """Whether the run has finished, stopped or crashed."""
        return self.status is not None and self.status.state in ENDED

    @property
    def total_steps(self) -> int | None:
        """The step the run ends at, when known: the engine's (a scheduler's length, ``--steps``),
        else run.json's config."""
        if self.status is not None and self.status.total_steps:
            return self.status.total_steps
        return self.info.config.steps if self.info is not None else None

    @property
    def epoch(self) -> int | None:
        """The training loop's epoch, when the engine counts it (its status, else a ``train/epoch`` series)."""
        if self.status is not None and self.status.epoch is not None:
            return self.status.epoch
        series = self.series.get("train/epoch")
        value = series.latest() if series is not None else None
        return int(value) if value is not None else None

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
        if isinstance(info.hosts, dict):
            self.hosts = {int(r): str(h) for r, h in info.hosts.items() if str(r).isdigit()}

    def _note_failures(self, failures: object) -> None:
        if not isinstance(failures, list):
            return
        for failure in failures:
            if isinstance(failure, dict) and isinstance(failure.get("rank"), int):
                self.rank_failures.setdefault(failure["rank"], failure.get("exitcode"))
                self.note_world_size(failure["rank"] + 1)

    def add_history(self, history, newest_events: int) -> list[EventLine]:
        """Fold a source's History in (all but its status); the event lines of its newest
        ``newest_events`` events (older ones still count for findings and stalls)."""
        if history.info is not None:
            self.info = history.info
            self.note_info(history.info)
        self.note_world_size(history.meta.get("world_size"))
        for rank, named in history.samples.items():
            self.merge_samples(rank, named)
        for name, (steps, values) in history.series.items():
            self.get(name).extend(steps, values)
        self._merge_ranks(history.ranks)
        self.add_walls(*history.walls)
        if history.layer_names is not None:
            self.add_layer_names(history.layer_names)
        if history.schedule is not None:
            self.schedule = history.schedule
        for layers in history.layers:
            self.add_layers(layers)
        for event in history.events[:-newest_events]:
            self.note_event(event)
        lines = [self.add_event(event) for event in history.events[-newest_events:]]
        return [line for line in lines if line is not None]

    def add_backfill(self, backfill) -> None:
        """Fold rows read back from the store (a gap in the live stream) in."""
        for name, (steps, values) in backfill.series.items():
            self.get(name).merge(steps, values)
        self._merge_ranks(backfill.ranks)
        for rank, named in backfill.samples.items():
            self.merge_samples(rank, named)
        self.add_walls(*backfill.walls)

    def _merge_ranks(self, by_rank: dict[int, dict]) -> None:
        for rank, own in by_rank.items():
            for name, (steps, values) in own.items():
                self.rank_get(rank, name).merge(steps, values)

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

    def note_sent(self, command_id: str | None, text: str, level: str = "dim") -> EventLine:
        """The line of a command just sent (``text``), which its ack will turn into the outcome."""
        line = EventLine(time.time(), None, text, level, "command", command_id)
        self.events.append(line)
        return line

    def add_ack(self, ack: Ack, command_text: str) -> EventLine:
        """Record an ack; ``command_text`` says what the command was ("clip 0.5").

        The command's "sent" line becomes its outcome (one line per command); a checkpoint's
        ack and the engine's checkpoint event share one line.
        """
        self.seen_commands.add(ack.id)
        if ack.name == "profile" and ack.ok:
            self.profile_pending = f"{ack.message}…" if ack.message else self.profile_pending
        elif ack.name == "profile":
            self.profile_pending, self.profile_note = None, f"profile refused: {ack.message}"
        where = f"step {ack.step} " if ack.step is not None else ""
        kind = "command"
        if not ack.ok:
            text, level = f"{command_text} refused: {ack.message}", "error"
        elif ack.name == "checkpoint" and ack.message:
            text, level, kind = f"{where}checkpoint {ack.message}", "ok", "checkpoint"
            self._drop(lambda e: e.kind == "checkpoint" and e.step == ack.step and e.command_id is None)
        elif ack.message and ack.name not in ("pause", "resume"):
            # The engine's words say what changed ("clip norm 1 -> 0.5 from step 541"): first,
            # so a narrow pane still shows them.
            text, level = f"{where}{ack.message}", "ok"
        else:
            text, level = f"{where}{command_text} applied", "ok"
        line = next((e for e in reversed(self.events) if e.command_id == ack.id), None)
        if line is None:
            line = EventLine(time.time(), ack.step, text, level, kind, ack.id)
            self.events.append(line)
        else:
            line.wall, line.step, line.text, line.level, line.kind = time.time(), ack.step, text, level, kind
            self.events_changed = True
        return line

    def _drop(self, match) -> None:
        kept = [e for e in self.events if not match(e)]
        if len(kept) != len(self.events):
            self.events[:] = kept
            self.events_changed = True

    def note_event(self, event: Event) -> None:
        """Keep what the tabs show of an event that gets no line in the events pane (older history)."""
        self._note(event)

    def add_event(self, event: Event) -> EventLine | None:
        """Record an engine event; a command event already shown by its ack is skipped."""
        kind, message, step, wall = event.kind, event.message, event.step, event.wall
        what = self._note(event)
        if isinstance(what, events.CommandAnswer) and what.id:
            if what.id in self.seen_commands:
                return None
            self.seen_commands.add(what.id)
        if kind == "checkpoint" and any(e.kind == "checkpoint" and e.step == step for e in self.events[-20:]):
            return None  # the line of the checkpoint command that asked for it says it already
        if isinstance(what, events.PrintedMetric) and self.printed.line is not None:
            if any(e is self.printed.line for e in self.events):  # one line for them all, rewritten in place
                self.events_changed = True
                return None
            self.events.append(self.printed.line)
            return self.printed.line
        level = EVENT_LEVELS.get(kind, "info")
        if (isinstance(what, events.CommandAnswer) and not what.ok) or (isinstance(what, events.Profile)
                                                                         and what.error):
            level = "error"
        elif isinstance(what, events.Stall) and what.ended:
            level = "ok"
        elif isinstance(what, events.Node) and what.lost:
            level = "error"
        where = f"step {step} " if step is not None else ""
        if event.rank:
            where += f"rank {event.rank} "
        text = {"finding": f"⚑ doctor: {message}", "checkpoint": f"checkpoint {message}",
                "optimizer": f"run: {message}"}.get(kind, f"{kind}: {message}")
        line = EventLine(wall or time.time(), step, f"{where}{text}", level, kind)
        self.events.append(line)
        return line

    def _note(self, event: Event) -> events.EventData:
        """Keep what the tabs and the header show of an event; what it says."""
        what = events.read(event)
        self.incidents.add(event, what)
        if isinstance(what, events.CommandAnswer):
            if what.ok and what.name in ("pause", "resume"):
                # Running time only: the rate and the ETA leave out the time the run stood still.
                (self.rate.pause if what.name == "pause" else self.rate.resume)(event.wall)
            elif what.ok and what.name == "profile":
                self.profile_pending = f"{event.message.partition(': ')[2] or 'profiling'}…"
        elif isinstance(what, events.Anomaly) and what.paused:
            self.rate.pause(event.wall)
            self.pause_reason = f"non-finite gradient in {what.layer or 'the loss'}"
        elif isinstance(what, events.Finding):
            self.findings.add(event)
            if what.id == "no-step":
                self.no_step = what.what or event.message
        elif isinstance(what, events.Stall):
            self.findings.add(event)  # its stacks say, once the run is over, how long a stall not ended lasted
            self.stacks = (f"at the stall at step {what.step}", what.stacks) if what.stacks else self.stacks
            if what.ended:
                self.stalled.clear()
            for rank in what.ranks:
                self.stalled[rank] = what.step if what.step is not None else (event.step or 0)
                self.note_world_size(rank + 1)
        elif isinstance(what, events.Optimizer):
            self.optimizers[what.index] = what.label
        elif isinstance(what, events.Profile):
            self.profile, self.profile_pending, self.profile_note = what, None, None
        elif isinstance(what, events.Oom):
            self.oom = what
        elif isinstance(what, events.Hint):
            self.hint = event.message
        elif isinstance(what, events.PrintedMetric):
            self.printed.take(event.wall or time.time(), event.step, what)
        return what
