"""The wire encoding of ``protocol``'s messages: JSON objects, length-prefixed frames.

A frame is a 4-byte big-endian length followed by that many bytes of UTF-8 JSON. The JSON
object carries ``"type"`` (the message kind) and ``"v"`` (the schema version) beside the
message's fields; a Metrics message's rows travel as ``"packed"`` columns of binary
numbers (packed.py), which decoding turns back into ``rows``. Decoding checks kind,
version, field types and numbers, and raises ProtocolError, and nothing else, for
anything the protocol does not carry. Stdlib only.

The message types live in ``protocol``, the layer below: it knows nothing of this one.
"""

from __future__ import annotations

import dataclasses
import json
import math
import struct
from typing import Any

from . import packed
from .numbers import json_safe
from .protocol import MAX_FRAME, MESSAGES, VERSION, Command, Hello, Message, Metrics, ProtocolError

_HEADER = struct.Struct(">I")


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
    if "packed" in body and cls is Metrics:
        body = {**body, "rows": packed.take(body)}
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

    The engine's messages never fail on a value JSON cannot hold: a non-finite number
    travels as null and anything else as its text (``numbers.json_safe``), so one NaN in an
    event cannot stop a flush's messages. A client's message (a command, a hello) is
    refused instead: a command's null means "no override", so a NaN clip norm sent as null
    would turn clipping off. Raises ProtocolError for that and for a frame above MAX_FRAME.
    """
    body = to_dict(msg)
    if type(msg) is Metrics:
        packed.put(body, msg.rows)  # the rows' numbers in binary (packed.py)
    try:
        text = json.dumps(body, separators=(",", ":"), allow_nan=False)
    except (ValueError, TypeError):  # the rare message holding NaN, a path, a huge int
        if type(msg) in _FROM_CLIENTS:
            raise ProtocolError(_unsendable(msg)) from None
        text = json.dumps(json_safe(body)[0], separators=(",", ":"), allow_nan=False)
    payload = text.encode()
    if len(payload) > MAX_FRAME:
        raise ProtocolError(f"frame of {len(payload)} bytes exceeds {MAX_FRAME}")
    return _HEADER.pack(len(payload)) + payload


_FROM_CLIENTS = (Command, Hello)
"""What clients send: a value JSON cannot hold is refused, never replaced (see ``encode``)."""


def _unsendable(msg: Message) -> str:
    """Why a client's message cannot be sent, in one line naming the value."""
    for f in dataclasses.fields(msg):
        value = getattr(msg, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            what = f"{msg.name} {f.name}" if isinstance(msg, Command) else f"{msg.type} {f.name}"
            return (f"{what} {value!r} is not a finite number: not sent (a command's null would mean "
                    "no override)")
    return f"the {msg.type} message holds a value JSON cannot carry: not sent"


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

