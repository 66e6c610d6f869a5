"""JSON objects read into typed dataclasses and written back: the records events carry
(events.py).

A ``Record`` is a dataclass whose fields are typed with JSON-able types (str, int, float,
bool, None, tuples of them, dicts, or another ``Record``) and all defaulted. Reading one
never raises: a value that does not fit its field's type reads as the default, an unknown
key is left out. A field's ``metadata["key"]`` names its JSON key where the field's name
cannot (a Python keyword, ``class``). Stdlib only.
"""

from __future__ import annotations

import dataclasses
import typing
from types import NoneType, UnionType
from typing import Any


class Record:
    """A dataclass that travels as a JSON object inside an event's data (a profile's ops)."""

    @classmethod
    def from_data(cls, data: object):
        """The record a JSON object describes; what does not fit reads as the defaults."""
        if not isinstance(data, dict):
            return cls()
        hints = _hints(cls)
        values = {}
        for f in dataclasses.fields(cls):
            key = f.metadata.get("key", f.name)
            if key in data:
                ok, value = _conform(data[key], hints[f.name])
                if ok:
                    values[f.name] = value
        return cls(**values)

    def to_data(self) -> dict:
        """The JSON object for this record."""
        return {f.metadata.get("key", f.name): _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}


def _hints(cls: type) -> dict[str, Any]:
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    return hints


_HINTS: dict[type, dict[str, Any]] = {}


def _conform(value: Any, hint: Any) -> tuple[bool, Any]:
    """``(True, value as hint types it)`` when the JSON value fits ``hint``, else ``(False, None)``."""
    origin = typing.get_origin(hint)
    if origin in (UnionType, typing.Union):
        for option in typing.get_args(hint):
            ok, out = _conform(value, option)
            if ok:
                return True, out
        return False, None
    if origin is tuple:
        item = typing.get_args(hint)[0]
        if not isinstance(value, list):
            return False, None
        out = []
        for v in value:
            ok, v = _conform(v, item)
            if not ok:
                return False, None
            out.append(v)
        return True, tuple(out)
    if hint is NoneType:
        return value is None, None
    if hint is bool:
        return type(value) is bool, value
    if hint is int:
        return type(value) is int, value
    if hint is float:
        return type(value) in (int, float), float(value) if type(value) in (int, float) else None
    if hint in (str, dict, list):
        return isinstance(value, hint), value
    if isinstance(hint, type) and issubclass(hint, Record):
        return isinstance(value, dict), hint.from_data(value) if isinstance(value, dict) else None
    return False, None


def _plain(value: Any) -> Any:
    if isinstance(value, Record):
        return value.to_data()
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value
