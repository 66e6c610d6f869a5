"""The wire protocol between the engine and the dashboard: every message kind.

This module is the one place message kinds are defined. It uses only the standard
library, so the terminal side can import it without pulling in torch.

How a message travels (JSON with ``"type"`` and ``"v"``, in length-prefixed frames) is
``wire``'s job, the layer above this one: ``wire.encode``, ``wire.decode``, ``wire.to_dict``,
``wire.from_dict``, ``wire.FrameReader``. Nothing on the wire is ever executable: no pickle,
no eval.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

VERSION = 2
"""Schema version; a peer with another version is refused at the handshake.

2: ``Event`` carries its ``rank`` and store ``id``; parameter names moved from ``Layers``
to ``LayerNames``.
"""

MAX_FRAME = 8 * 1024 * 1024
"""Largest frame either side accepts, in bytes. Larger length prefixes are refused unread."""

class ProtocolError(ValueError):
    """A frame or message that does not follow this protocol."""


class TransportError(ConnectionError):
    """The socket cannot be used; the message is one line meant for the user."""


# ---------------------------------------------------------------------------- messages


@dataclass(frozen=True)
class Message:
    """Base of every message; subclasses set ``type``."""

    type: ClassVar[str] = ""


# Client -> engine ------------------------------------------------------------------


@dataclass(frozen=True)
class Hello(Message):
    """First frame from a client: proves it may talk to this run."""

    type: ClassVar[str] = "hello"
    token: str
    client: str = "dashboard"
    """Who is connecting (``dashboard``, ``ctl``); informational."""


COMMANDS = ("pause", "resume", "checkpoint", "clip", "lr_scale", "stop", "kill", "profile", "stacks", "rollback")
"""Every command name the engine understands (``stacks`` is answered at once by a ``Stacks``, not an Ack)."""


@dataclass(frozen=True)
class Command(Message):
    """A request to change the run, applied by the engine at the next step boundary."""

    type: ClassVar[str] = "command"
    id: str
    name: str
    value: float | None = None
    """The argument of ``clip`` (None turns the override off), ``lr_scale`` and ``profile``."""


# Engine -> client ------------------------------------------------------------------


@dataclass(frozen=True)
class Welcome(Message):
    """The engine's answer to a valid Hello: who this run is, and where its files are."""

    type: ClassVar[str] = "welcome"
    run_id: str
    run_dir: str
    pid: int
    world_size: int = 1


@dataclass(frozen=True)
class Refused(Message):
    """The engine's answer to a client it will not serve; the connection closes after it."""

    type: ClassVar[str] = "refused"
    reason: str


@dataclass(frozen=True)
class Metrics(Message):
    """A batch of per-step scalars, in step order.

    ``rows`` holds one ``[step, wall_time, {name: value}]`` list per optimizer step and
    rank. Names carry scope and unit (``loss``, ``opt/lr/group0``, ``grad/norm_total``).
    Non-finite values travel as None (JSON has no NaN); ``dropped`` counts rows the
    engine could not send to this client since the previous batch.
    """

    type: ClassVar[str] = "metrics"
    rows: list = field(default_factory=list)
    rank: int = 0
    dropped: int = 0


@dataclass(frozen=True)
class Samples(Message):
    """Readings taken by time, not by step (host CPU and memory, GPU memory and NVML).

    ``rows`` holds ``[wall_time, {name: value}]`` lists, oldest first; they are sampled
    once a second however long a step takes.
    """

    type: ClassVar[str] = "samples"
    rows: list = field(default_factory=list)
    rank: int = 0


@dataclass(frozen=True)
class Status(Message):
    """The run's state, sent on every change and with each flush.

    ``state`` is one of STATES; ``step`` counts completed optimizer steps.
    """

    type: ClassVar[str] = "status"
    state: str
    step: int
    total_steps: int | None = None
    paused_at: int | None = None
    clip: float | None = None
    """The live clip-norm override, None when the script's own clipping rules."""
    lr_scale: float = 1.0
    exit_code: int | None = None
    detail: str = ""
    epoch: int | None = None
    """The epoch of the training loop (its DataLoader's passes), when the engine counts them."""
    lr_fixed: bool = False
    """The LR factor cannot act: the script has no torch.optim optimizer (its LR is its own)."""


STATES = ("starting", "running", "pausing", "paused", "stopping", "finished", "stopped", "crashed")
"""Every run state. ``finished`` and ``stopped`` ended cleanly; ``crashed`` did not."""

ENDED = frozenset({"finished", "stopped", "crashed"})


@dataclass(frozen=True)
class Ack(Message):
    """The answer to one Command: applied at ``step``, or refused with ``message``."""

    type: ClassVar[str] = "ack"
    id: str
    name: str
    ok: bool
    step: int | None = None
    message: str = ""


@dataclass(frozen=True)
class Event(Message):
    """Something worth a line in the events pane and the journal.

    The same object from the engine's journal to the store and the dashboard: ``rank``
    says which rank it happened on (under DDP rank 0 collects the others'), ``id`` is its
    place in the store (0 until it is stored; live events carry 0).
    """

    type: ClassVar[str] = "event"
    kind: str
    step: int | None
    """The step it happened at (None only for notes the dashboard makes itself)."""
    wall: float
    message: str
    data: dict = field(default_factory=dict)
    rank: int = 0
    id: int = 0


@dataclass(frozen=True)
class LayerNames(Message):
    """The parameters that the following ``Layers`` messages describe, in their order.

    Sent (and stored) when the parameter list first becomes known and whenever it
    changes; a dashboard that connects later is sent the current one after the Welcome.
    """

    type: ClassVar[str] = "layer_names"
    step: int
    """The first step these names apply to."""
    names: list
    shapes: list
    rank: int = 0


@dataclass(frozen=True)
class Layers(Message):
    """Per-parameter gradient statistics at one step, sent once per flush.

    ``grad_norms`` and ``update_ratios`` (|w_after - w_before| / |w_before|, sampled every
    few steps; None in between) follow the order of the latest ``LayerNames``; ``flags``
    maps a parameter index (as a string) to ``vanishing``, ``exploding`` or ``nonfinite``.
    """

    type: ClassVar[str] = "layers"
    step: int
    grad_norms: list
    update_ratios: list | None = None
    flags: dict = field(default_factory=dict)
    rank: int = 0


@dataclass(frozen=True)
class Schedule(Message):
    """The main optimizer's LR schedule ahead, simulated on a copy of its scheduler.

    ``steps`` are optimizer steps from ``step`` on (decimated to a few hundred points);
    ``lrs`` holds, per param group, the scheduled LR at each of them, before the live LR
    factor (the dashboard multiplies that in, so a factor change redraws at once). With no
    schedule to show, ``steps`` is empty and ``note`` says why ("set by hand each step").
    ``end`` is the step the schedule ends at, when it has an end. Stored, and sent to each
    new dashboard after the Welcome.
    """

    type: ClassVar[str] = "schedule"
    step: int
    """The optimizer step it was computed at."""
    steps: list = field(default_factory=list)
    lrs: list = field(default_factory=list)
    end: int | None = None
    note: str = ""
    rank: int = 0


@dataclass(frozen=True)
class Stacks(Message):
    """The answer to a ``stacks`` command: every rank's stacks (``shared.stacks.RankStacks``
    JSON objects, by rank), taken by each engine's own thread while the training runs on."""

    type: ClassVar[str] = "stacks"
    id: str
    ranks: list = field(default_factory=list)
    wall: float = 0.0


MESSAGES: dict[str, type[Message]] = {
    cls.type: cls for cls in (Hello, Command, Welcome, Refused, Metrics, Samples, Status, Ack, Event, LayerNames,
                              Layers, Schedule, Stacks)
}
