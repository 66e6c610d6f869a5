"""The wire protocol between the engine and the dashboard: every message, and its framing.

This module is the one place message kinds are defined. It uses only the standard
library, so the terminal side can import it without pulling in torch.

A frame is a 4-byte big-endian length followed by that many bytes of UTF-8 JSON. The JSON
object carries ``"type"`` (the message kind) and ``"v"`` (the schema version). Nothing on
the wire is ever executable: no pickle, no eval.
"""

from __future__ import annotations

import dataclasses
import json
import math
import struct
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .numbers import json_safe

VERSION = 2
"""Schema version; a peer with another version is refused at the handshake.

2: ``Event`` carries its ``rank`` and store ``id``; parameter names moved from ``Layers``
to ``LayerNames``.
"""

MAX_FRAME = 8 * 1024 * 1024
"""Largest frame either side accepts, in bytes. Larger length prefixes are refused unread."""

_HEADER = struct.Struct(">I")


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


COMMANDS = ("pause", "resume", "checkpoint", "clip", "lr_scale", "stop", "kill", "profile")
"""Every command name the engine understands."""


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


MESSAGES: dict[str, type[Message]] = {
    cls.type: cls for cls in (Hello, Command, Welcome, Refused, Metrics, Samples, Status, Ack, Event, LayerNames,
                              Layers, Schedule)
}


# --------------------------------------------------------------------------- framing


def to_dict(msg: Message) -> dict:
    """The JSON object for ``msg``."""
    body = {"type": msg.type, "v": VERSION}
    # Shallow: fields hold only JSON values, and dataclasses.asdict deep-copies them
    # (about 90 ms for a flush of 200 metric rows, against 1 ms for this).
    body.update((f.name, getattr(msg, f.name)) for f in dataclasses.fields(msg))
    return body


def from_dict(body: Any) -> Message:
    """Build the message a decoded JSON object describes, checking kind, version and fields."""
    if not isinstance(body, dict):
        raise ProtocolError("a message must be a JSON object")
    kind = body.get("type")
    cls = MESSAGES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ProtocolError(f"unknown message type {kind!r}")
    if body.get("v") != VERSION:
        raise ProtocolError(f"protocol version {body.get('v')!r} is not {VERSION}")
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {k: v for k, v in body.items() if k in names}
    try:
        msg = cls(**kwargs)
    except TypeError as exc:
        raise ProtocolError(f"bad {kind} message: {exc}") from None
    _check_types(msg)
    return msg


_SCALARS = {"str": str, "int": int, "float": (int, float), "bool": bool, "list": list, "dict": dict}


def _check_types(msg: Message) -> None:
    for f in dataclasses.fields(msg):
        value = getattr(msg, f.name)
        annotation = str(f.type)
        if value is None and "None" in annotation:
            continue
        base = annotation.split("|")[0].strip()
        expected = _SCALARS.get(base)
        ok = expected is None or isinstance(value, expected)
        if ok and base in ("int", "float") and isinstance(value, bool):
            ok = False
        if not ok:
            raise ProtocolError(f"bad {msg.type} message: {f.name} must be {annotation}")


def encode(msg: Message) -> bytes:
    """One length-prefixed frame holding ``msg``.

    Never fails on a value JSON cannot hold: a non-finite number travels as null and
    anything else as its text (``numbers.json_safe``), so one NaN in an event cannot stop
    a flush's messages. Raises ProtocolError only for a frame above MAX_FRAME.
    """
    body = to_dict(msg)
    try:
        text = json.dumps(body, separators=(",", ":"), allow_nan=False)
    except (ValueError, TypeError):  # the rare message holding NaN, a path, a huge int
        text = json.dumps(json_safe(body)[0], separators=(",", ":"), allow_nan=False)
    payload = text.encode()
    if len(payload) > MAX_FRAME:
        raise ProtocolError(f"frame of {len(payload)} bytes exceeds {MAX_FRAME}")
    return _HEADER.pack(len(payload)) + payload


INT_LIMIT = 2 ** 63
"""Integers on the wire are 64-bit (what SQLite stores); a longer one is refused at decode."""


class _Unfit:
    """Stands in, while decoding, for a number the protocol does not carry."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


def decode(payload: bytes) -> Message:
    """The message in one frame's payload (without its length prefix).

    Raises ProtocolError, and nothing else, for any payload: not UTF-8 JSON, nested too
    deeply, or holding a number the protocol does not carry (NaN, infinity, ``1e309``, an
    integer beyond 64 bits however many digits it has), named by its field.
    """
    unfit: list[_Unfit] = []

    def refuse(text: str) -> _Unfit:
        marker = _Unfit(text)
        unfit.append(marker)
        return marker

    def parse_float(text: str):
        value = float(text)  # JSON's number syntax always converts; too large becomes inf
        return value if math.isfinite(value) else refuse(text)

    def parse_int(text: str):
        # Length first: int() of thousands of digits raises (Python's digit limit).
        if len(text) <= 20:
            value = int(text)
            if -INT_LIMIT <= value < INT_LIMIT:
                return value
        return refuse(text)

    try:
        body = json.loads(payload.decode("utf-8"), parse_float=parse_float, parse_int=parse_int,
                          parse_constant=refuse)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"frame is not UTF-8 JSON: {exc}") from None
    except RecursionError:
        raise ProtocolError("JSON nested too deeply") from None
    except ValueError as exc:  # whatever else the parser refuses, in one line
        raise ProtocolError(f"frame is not valid JSON: {str(exc)[:120]}") from None
    if unfit:
        raise ProtocolError(_unfit_message(body, unfit[0]))
    return from_dict(body)


def _unfit_message(body: Any, marker: _Unfit) -> str:
    """``bad command message: value is 1e309, not a finite number within 64 bits``."""
    kind = body.get("type") if isinstance(body, dict) else None
    what = f"bad {kind[:32]} message" if isinstance(kind, str) else "bad message"
    text = marker.text if len(marker.text) <= 24 else f"{marker.text[:12]}... ({len(marker.text)} characters)"
    return f"{what}: {_path_to(body, marker) or 'a value'} is {text}, not a finite number within 64 bits"


def _path_to(value: Any, marker: _Unfit, path: str = "") -> str | None:
    """Where ``marker`` sits inside ``value``: ``value``, ``rows[3][2].loss``."""
    if value is marker:
        return path
    if isinstance(value, dict):
        items = ((f"{path}.{k}" if path else str(k), v) for k, v in value.items())
    elif isinstance(value, list):
        items = ((f"{path}[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    for where, item in items:
        found = _path_to(item, marker, where)
        if found is not None:
            return found
    return None


class FrameReader:
    """Incremental frame splitter for a byte stream: feed bytes, take whole payloads.

    Refuses a length prefix above ``max_frame`` before buffering the frame, so a peer
    cannot make the reader hold more than that.
    """

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self._buffer = bytearray()
        self._max_frame = max_frame

    def feed(self, data: bytes) -> list[bytes]:
        """Add received bytes; return the payloads of the frames now complete."""
        self._buffer += data
        frames = []
        while len(self._buffer) >= _HEADER.size:
            (length,) = _HEADER.unpack_from(self._buffer)
            if length > self._max_frame:
                raise ProtocolError(f"frame of {length} bytes exceeds the limit of {self._max_frame}")
            end = _HEADER.size + length
            if len(self._buffer) < end:
                break
            frames.append(bytes(self._buffer[_HEADER.size:end]))
            del self._buffer[:end]
        return frames

