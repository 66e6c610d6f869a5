"""Every event kind and the data it carries, as small frozen dataclasses.

An ``Event`` (protocol.py) carries its data as a JSON object, on the wire and in the store;
this module is the one place that object is written and read. The engine journals a
dataclass (``journal.event(Stall(ranks=(1,), step=29), "rank 1 stalled ...")``), which
``encode`` turns into the event's kind and data; the dashboard, ``show --once``, the doctor
and export call ``read(event)`` and read attributes, never keys.

Reading never raises: a field of the wrong type reads as its default, unknown keys are left
out (a ``Finding`` keeps them in ``extra``), and a kind this version does not know (a newer
engine's) reads as a ``Note``, whose event is shown by its message. Events an older engine
wrote in an older shape are read into today's classes (``_LEGACY``).

Kinds whose events carry only their message (``store``, ``disk``) have no class: they are
journaled by name (``journal.event("disk", "...")``) and read as a ``Note``.

Adding a kind: a frozen dataclass subclassing ``EventData``, with ``kind`` set, every field
defaulted and typed with JSON-able types (str, int, float, bool, None, tuples of them,
dicts, or a ``Record``: records.py, which reads them), decorated with ``@kind``; the engine
journals it, readers match on its class. Stdlib only.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar, TypeVar

from .protocol import Event
from .records import Record
from .stacks import RankStacks


class EventData(Record):
    """The data of one kind of event."""

    kind: ClassVar[str] = ""


KINDS: dict[str, type[EventData]] = {}
"""Every kind this version knows, by name."""

T = TypeVar("T", bound=type)


def kind(cls: T) -> T:
    """Register an EventData class under its ``kind``."""
    KINDS[cls.kind] = cls
    return cls


def encode(data: EventData) -> tuple[str, dict]:
    """The kind and JSON object an event of ``data`` carries."""
    return data.kind, data.to_data()


def read(event: Event) -> EventData:
    """What ``event`` says, as the dataclass of its kind (a ``Note`` for a kind not known here)."""
    data = event.data if isinstance(event.data, dict) else {}
    legacy = _LEGACY.get(event.kind)
    if legacy is not None:
        found = legacy(data)
        if found is not None:
            return found
    cls = KINDS.get(event.kind, Note)
    return cls.from_data(data)


# ------------------------------------------------------------------------------ kinds


@dataclass(frozen=True)
class Note(EventData):
    """An event that carries only its message (``store``, ``disk``; a kind not known here)."""


@kind
@dataclass(frozen=True)
class CommandAnswer(EventData):
    """How the engine answered a command: applied at ``applied_step``, or refused."""

    kind: ClassVar[str] = "command"
    id: str = ""
    name: str = ""
    value: float | None = None
    ok: bool = False
    applied_step: int | None = None


@kind
@dataclass(frozen=True)
class Anomaly(EventData):
    """A bad step the judge found (engine/judge.py): ``what`` it was (``non-finite``, ``loss
    spike``, ``gradient norm spike``), a spike's ``value`` and the ``limit`` it passed, the
    parameter (``layer``) a non-finite gradient was first seen in, and what ``--on-anomaly``
    did about it (``action``: ``pause``, ``skip``, ``warn``). Older runs' events may carry a
    parameter's ``flag`` with its ``count``, or a spike's ``loss`` and ``average``.
    """

    kind: ClassVar[str] = "anomaly"
    step: int | None = None
    action: str | None = None
    layer: str | None = None
    flag: str | None = None
    count: int | None = None
    loss: float | None = None
    average: float | None = None
    what: str | None = None
    value: float | None = None
    limit: float | None = None
    applied: bool | None = None
    """Whether the bad update was applied (found at the flush, or under DDP): a pause then
    skips nothing."""

    @property
    def paused(self) -> bool:
        """Whether the run paused for it."""
        return self.action == "pause"


@kind
@dataclass(frozen=True)
class Rollback(EventData):
    """``--on-anomaly rollback``: the state of ``to_step`` was put back at ``step`` because of
    ``why`` (first seen at ``from_step``), ``skipped`` batches' updates not kept, of which
    ``undone`` had been applied (the bad one's never is on CPU); or (with
    ``limit``) too many rollbacks, and the run paused or stopped (``action``); or (``lr_scale``
    alone) the LR factor lowered after one came back."""

    kind: ClassVar[str] = "rollback"
    step: int | None = None
    from_step: int | None = None
    to_step: int | None = None
    why: str | None = None
    skipped: int | None = None
    undone: int | None = None
    lr_scale: float | None = None
    limit: int | None = None
    within: int | None = None
    action: str | None = None


@kind
@dataclass(frozen=True)
class Snapshot(EventData):
    """The state kept in host memory for rollbacks: its ``bytes``, the ``seconds`` a refresh
    took, every how many steps, and the ``limit`` of ``--rollback-memory``."""

    kind: ClassVar[str] = "snapshot"
    step: int | None = None
    bytes: int | None = None
    seconds: float | None = None
    every: int | None = None
    limit: int | None = None


@kind
@dataclass(frozen=True)
class Stall(EventData):
    """No rank made a step for a while: ``ranks`` are the ones named as the cause (empty when
    every rank waits at the same step). A second event, ``ended``, says the stall is over (some
    rank made a step again, or the run ended while stalled) and its whole length in ``seconds``."""

    kind: ClassVar[str] = "stall"
    step: int | None = None
    """The step the run stands at: the newest step the quiet ranks reported (one whose reports
    stopped behind it, its GIL held, is named in the message with its last one)."""
    ranks: tuple[int, ...] = ()
    seconds: float | None = None
    """How long no rank had made a step: when it was named, or (``ended``) the whole stall."""
    started: float | None = None
    """The wall time of the newest step before the stall (its start)."""
    why: str = ""
    ended: bool = False
    with_run: bool = False
    """The stall ended because the run did (the script ended or was stopped while stalled)."""
    where: str = ""
    """Where the ranks were, by their stacks ("rank 1 was in `slow` (train.py:12) for 40 s; ...")."""
    stacks: tuple[RankStacks, ...] = ()
    """Every rank's stacks, taken when the stall was named (shared/stacks.py)."""


@kind
@dataclass(frozen=True)
class Checkpoint(EventData):
    """A checkpoint saved (``path``), or older ones removed to make room (``removed``)."""

    kind: ClassVar[str] = "checkpoint"
    path: str | None = None
    bytes: int | None = None
    seconds: float | None = None
    reason: str | None = None
    removed: tuple[str, ...] = ()


@kind
@dataclass(frozen=True)
class Finding(EventData):
    """A training doctor's finding: rule ``id``, what was seen, why it matters, the fix.

    ``extra`` keeps the rule's own details (``num_workers``, ``params``...) for export.
    """

    kind: ClassVar[str] = "finding"
    id: str = ""
    what: str = ""
    why: str = ""
    fix: str = ""
    severity: str | None = None
    step: int | None = None
    source: str | None = None
    module: str | None = None
    case: str | None = None
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_data(cls, data: object) -> Finding:
        found = super().from_data(data)
        if isinstance(data, dict):
            known = {f.name for f in dataclasses.fields(cls)}
            found = dataclasses.replace(found, extra={k: v for k, v in data.items() if k not in known})
        return found

    def to_data(self) -> dict:
        out = super().to_data()
        return {**out.pop("extra"), **out}


@kind
@dataclass(frozen=True)
class Hint(EventData):
    """A hint for the System tab (the loop waits for data)."""

    kind: ClassVar[str] = "hint"
    data_share: float | None = None


@kind
@dataclass(frozen=True)
class Warned(EventData):
    """A warning: a Python warning the script raised (``origin`` ``python``), ranks that never
    reached ptdash (``missing``), a parameter's vanishing gradient (``flag``), or a note."""

    kind: ClassVar[str] = "warning"
    origin: str | None = None
    category: str | None = None
    text: str | None = None
    source: str | None = None
    missing: tuple[int, ...] = ()
    peer: str | None = None
    """A peer the node port refused (several nodes)."""
    flag: str | None = None
    layer: str | None = None
    count: int | None = None


@kind
@dataclass(frozen=True)
class Sampling(EventData):
    """The cost budget changed how sparsely per-layer statistics and the doctor sample steps."""

    kind: ClassVar[str] = "sampling"
    every: int | None = None
    doctor_every: int | None = None
    budget_pct: float | None = None


@dataclass(frozen=True)
class TopOp(Record):
    """One op of a profile's summary (times in milliseconds, memory its own allocations)."""

    name: str = "?"
    calls: int | None = None
    self_ms: float | None = None
    total_ms: float | None = None
    self_device_ms: float | None = None
    total_device_ms: float | None = None
    cpu_mem_bytes: int | None = None
    device_mem_bytes: int | None = None


@kind
@dataclass(frozen=True)
class Profile(EventData):
    """The summary of a profile window: ``steps`` (first, last), the trace, the top ops, or an error."""

    kind: ClassVar[str] = "profile"
    steps: tuple[int, ...] = ()
    trace: str | None = None
    device: str | None = None
    top: tuple[TopOp, ...] = ()
    error: str | None = None


@kind
@dataclass(frozen=True)
class Oom(EventData):
    """The script ran out of memory: the error, the allocator's view, what to try."""

    kind: ClassVar[str] = "oom"
    cuda: bool = False
    device: str | None = None
    error: str | None = None
    memory_summary: str | None = None
    allocator: tuple[dict, ...] = ()
    remedies: tuple[str, ...] = ()
    snapshot: str | None = None
    """A memory snapshot written for pytorch.org/memory_viz, when one could be."""


@kind
@dataclass(frozen=True)
class Optimizer(EventData):
    """An optimizer became known: the ``index`` of its series (``opt<k>/...``; 0 the main one,
    from step ``main_from`` when it took over), its class and the models it updates."""

    kind: ClassVar[str] = "optimizer"
    index: int = 0
    cls: str = field(default="", metadata={"key": "class"})
    models: str | None = None
    main_from: int | None = None

    @property
    def label(self) -> str:
        """How the dashboard names it: the models it updates, else its class."""
        return self.models or self.cls


@kind
@dataclass(frozen=True)
class RunNote(EventData):
    """Something about the run as a whole: started, found its model, the rank channel, resumed, ended."""

    kind: ClassVar[str] = "run"
    models: tuple[str, ...] = ()
    world: int | None = None
    exchanges: int | None = None
    seconds: float | None = None
    steps: int | None = None
    restored: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    step: int | None = None
    total: int | None = None
    hosts: dict = field(default_factory=dict)
    """Rank (as a string) -> its host, once every rank of a job of several nodes reached the hub."""


@kind
@dataclass(frozen=True)
class Node(EventData):
    """A node of a job of several nodes joined the run, or was ``lost`` (killed, the network
    cut) with its ``ranks``, for the reason ``why``."""

    kind: ClassVar[str] = "node"
    node: int | None = None
    host: str | None = None
    port: int | None = None
    """Where the hub listens for the other nodes (node 0's event)."""
    ranks: tuple[int, ...] = ()
    lost: bool = False
    why: str = ""


@kind
@dataclass(frozen=True)
class PrintedMetric(EventData):
    """A metric the script printed was found (its first value, the line it came from), or
    is ``left_out``: ``logged`` (ptdash.log gives it) or ``too many`` (printed names)."""

    kind: ClassVar[str] = "printed"
    name: str = ""
    series: str | None = None
    value: float | None = None
    line: str | None = None
    left_out: str | None = None


# --------------------------------------------------------------- older engines' shapes


def _legacy_anomaly(data: dict) -> EventData | None:
    if "stalled_ranks" in data:  # stalls were anomalies, their ranks under "stalled_ranks"
        ranks = data["stalled_ranks"]
        step = data.get("step")
        return Stall(step=step if type(step) is int else None,
                     ranks=tuple(r for r in ranks if type(r) is int) if isinstance(ranks, list) else ())
    return None


def _legacy_run(data: dict) -> EventData | None:
    if type(data.get("optimizer")) is int:  # optimizers were run notes
        return Optimizer.from_data({**data, "index": data["optimizer"], "models": data.get("name"),
                                    "main_from": data.get("step_from")})
    return None


_LEGACY = {"anomaly": _legacy_anomaly, "run": _legacy_run}
