"""Attribute swaps on torch's classes and modules that can all be undone."""

from __future__ import annotations

from typing import Any


class Patches:
    """Records every ``setattr`` it makes so ``undo()`` restores them, newest first.

    An attribute the owner only inherited is deleted on undo rather than set, so the
    inherited one shows through again.
    """

    def __init__(self) -> None:
        self._undo: list[tuple[Any, str, Any, bool]] = []

    def set(self, owner: Any, name: str, replacement: Any) -> None:
        existed = name in vars(owner)
        self._undo.append((owner, name, vars(owner).get(name), existed))
        setattr(owner, name, replacement)

    def undo(self) -> None:
        for owner, name, original, existed in reversed(self._undo):
            if existed:
                setattr(owner, name, original)
            else:
                delattr(owner, name)
        self._undo.clear()
