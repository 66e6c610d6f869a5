"""Staying out of the script's sight: what it can pickle, the lines its warnings name, the
frames its tracebacks show.

- ``own`` marks ptdash's wrapper functions. A warning raised with ``stacklevel`` from
  inside a wrapped function (a deprecated constructor, a helper that warns about its
  caller) names the same ``file:line`` as under plain python: the patched
  ``warnings.warn`` does not count ptdash's frames when it walks up the stack.
- ``script_traceback`` removes ptdash's frames (the bootstrap's at the top, wrappers in
  the middle) from an exception's traceback, so it prints frame for frame as python's.
- ``ModuleState`` keeps ptdash's forward hook out of a pickled or deep-copied module:
  ``torch.save(model)``, ``copy.deepcopy(model)`` and EMA copies see the module as the
  script made it.
"""

from __future__ import annotations

import os
import sys
import types
import warnings
from collections import OrderedDict
from typing import Any, Callable

from .patching import Patches

_OWN: set[types.CodeType] = set()
"""The code objects of ptdash's wrapper functions."""

_ENGINE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_DEMO_DIR = os.path.join(_ENGINE_DIR, "demo") + os.sep


def own(fn: Callable) -> Callable:
    """Mark ``fn`` (a wrapper ptdash puts around the script's calls) as ptdash's own."""
    _OWN.add(fn.__code__)
    return fn


def is_own_frame(frame) -> bool:
    code = frame.f_code
    if code in _OWN:
        return True
    filename = os.path.abspath(code.co_filename)
    return filename.startswith(_ENGINE_DIR) and not filename.startswith(_DEMO_DIR)


def patch_warn(patches: Patches) -> None:
    """``warnings.warn`` that skips ptdash's wrapper frames when it counts ``stacklevel``."""
    original = warnings.warn

    def warn(message, category=None, stacklevel=1, source=None, **kwargs):
        extra = 0
        frame = sys._getframe(1)
        for _ in range(max(0, stacklevel - 1)):
            frame = frame.f_back if frame is not None else None
            while frame is not None and frame.f_code in _OWN:
                frame = frame.f_back
                extra += 1
        # One more for this frame: the original counts from its own caller, which is us.
        return original(message, category, stacklevel + extra + 1, source, **kwargs)

    own(warn)
    warn.__wrapped__ = original
    patches.set(warnings, "warn", warn)


def script_traceback(exc: BaseException) -> BaseException:
    """``exc`` (and the exceptions it chains to) with ptdash's frames taken out of the
    traceback, as python would have printed it for the script alone."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        e.__traceback__ = _without_own(e.__traceback__)
        todo += [e.__cause__, e.__context__]
        todo += list(getattr(e, "exceptions", ()))  # exception groups
    return exc


def _without_own(tb: types.TracebackType | None) -> types.TracebackType | None:
    kept = []
    while tb is not None:
        if not is_own_frame(tb.tb_frame):
            kept.append(tb)
        tb = tb.tb_next
    head = None
    for entry in reversed(kept):
        head = types.TracebackType(head, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return head


class ModuleState:
    """A ``Module.__getstate__`` that leaves out the hooks ptdash put on a module."""

    def __init__(self) -> None:
        self.hooks: list[Any] = []
        """The hook functions ptdash registered on modules (compared by identity)."""

    def attach(self, patches: Patches) -> None:
        import torch

        original = torch.nn.Module.__getstate__
        hooks = self.hooks

        def __getstate__(module):
            state = original(module)
            registered = state.get("_forward_pre_hooks")
            if registered and any(h is mine for h in registered.values() for mine in hooks):
                state["_forward_pre_hooks"] = OrderedDict(
                    (k, h) for k, h in registered.items() if not any(h is mine for mine in hooks))
            return state

        own(__getstate__)
        __getstate__.__wrapped__ = original
        patches.set(torch.nn.Module, "__getstate__", __getstate__)
