"""Where the user's code is: the ``file:line`` behind a call, a crash or a forward op.

Frames of torch, ptdash and the standard library are skipped, so a finding names the
script's own line.
"""

from __future__ import annotations

import linecache
import os
import re
import sys
import sysconfig
import warnings

import torch

_ENGINE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_DEMO_DIR = os.path.join(_ENGINE_DIR, "demo") + os.sep
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_STDLIB_DIR = os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep


def is_internal(filename: str) -> bool:
    """Frames of torch, ptdash's engine or the standard library: never the user's line."""
    if filename.startswith("<frozen") or filename.startswith(_TORCH_DIR):
        return True
    if filename.startswith(_ENGINE_DIR) and not filename.startswith(_DEMO_DIR):  # the demo is user code
        return True
    return filename.startswith(_STDLIB_DIR) and "-packages" not in filename


def user_frame(frame):
    """The innermost frame at or above ``frame`` that belongs to the user's code."""
    while frame is not None and is_internal(os.path.abspath(frame.f_code.co_filename)):
        frame = frame.f_back
    return frame


def short_path(filename: str) -> str:
    """A path relative to the working directory when it is inside it."""
    try:
        rel = os.path.relpath(filename)
    except ValueError:
        return filename
    return filename if rel.startswith("..") else rel


def where(frame) -> str | None:
    """``train.py:42`` for a frame (None for no frame)."""
    return None if frame is None else f"{short_path(frame.f_code.co_filename)}:{frame.f_lineno}"


def caller() -> str | None:
    """The user's source line that led to the current call (a few microseconds)."""
    return where(user_frame(sys._getframe(1)))


def line_text(source: str | None) -> str:
    """The stripped text of a ``path:line`` source, or ''."""
    path, _, line = (source or "").rpartition(":")
    try:
        return linecache.getline(path, int(line)).strip() if path else ""
    except (ValueError, OSError):
        return ""


def quoted(source: str | None) -> str:
    """``train.py:42 (`loss.item()`)``: a source with its line of code."""
    text = line_text(source)
    return f"{source} (`{text}`)" if text else (source or "an unknown line")


def name_list(names: list[str], limit: int = 5) -> str:
    """``a, b, c and 4 more``."""
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


def remove_filter(entry) -> None:
    """Take one entry out of the warning filters (one this module put there)."""

    if entry is not None and entry in warnings.filters:
        warnings.filters.remove(entry)
        mutated = getattr(warnings, "_filters_mutated", None)
        if mutated is not None:
            mutated()


_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')


def anomaly_source(trace: str) -> str | None:
    """The innermost user frame of the forward traceback that anomaly mode prints."""
    found = None
    for m in _FRAME.finditer(trace):
        if not is_internal(os.path.abspath(m["file"])):
            found = f"{short_path(os.path.abspath(m['file']))}:{m['line']}"
    return found


def crash_source(exc: BaseException) -> str | None:
    """The innermost user frame of an exception's traceback."""
    tb, found = exc.__traceback__, None
    while tb is not None:
        if not is_internal(os.path.abspath(tb.tb_frame.f_code.co_filename)):
            found = f"{short_path(tb.tb_frame.f_code.co_filename)}:{tb.tb_lineno}"
        tb = tb.tb_next
    return found
