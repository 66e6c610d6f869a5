"""``NA``: a missing reading that prints as "N/A" instead of raising (nvitop's idea)."""

from __future__ import annotations

import re
from typing import Any


class _NAType:
    """The type of ``NA``: a missing value that prints as "N/A" and is falsy."""

    __slots__ = ()
    _instance: _NAType | None = None

    def __new__(cls) -> _NAType:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NA"

    def __str__(self) -> str:
        return "N/A"

    def __bool__(self) -> bool:
        return False

    def __format__(self, spec: str) -> str:
        # NA stands where a number would be, so a numeric spec such as ">8.1f" must not
        # raise; keep its fill, alignment and width and drop the rest.
        match = _FORMAT_SPEC.match(spec)
        if match is None:
            return "N/A"
        align = match["align"] or ("<" if match["type"] == "s" else ">")
        return format("N/A", f"{match['fill'] or ''}{'>' if align == '=' else align}{match['width'] or ''}")


_FORMAT_SPEC = re.compile(
    r"(?:(?P<fill>.)?(?P<align>[<>=^]))?[-+ ]?z?#?0?(?P<width>\d+)?[,_]?(?:\.\d+)?(?P<type>[bcdeEfFgGnosxX%])?\Z",
    re.DOTALL,
)

NA = _NAType()
"""The value of a metric that could not be read: ``str(NA) == "N/A"``, ``bool(NA) is False``."""


def _na_to_none(value: Any) -> Any:
    return None if value is NA else value
