"""Pure per-parameter gradient state for the Layers tab: ring buffers, grouping, sort, filter.

Folded from ``protocol.Layers`` messages (live, and rebuilt from stored blobs on attach).
Nothing here imports Textual, so the table's content is tested on plain lists; the
LayersView widget only draws the rows ``LayerStats.rows`` returns.
"""

from __future__ import annotations

import math
import re
from collections import deque
from dataclasses import dataclass

from ptdash.shared.protocol import LayerNames, Layers

HISTORY = 300
"""Grad-norm values kept per parameter (about 75 s of flushes at 4 a second)."""

FLAG_RANK = {"nonfinite": 3, "exploding": 2, "vanishing": 1}
"""How loud each flag is; a module shows its loudest parameter's flag."""

FLAG_STYLES = {"nonfinite": "bold red", "exploding": "red", "vanishing": "yellow"}

SORTS = ("name", "norm", "ratio", "flag")
"""Sort orders the ``o`` key cycles through; every one but name puts the largest first."""

SORT_LABELS = {"name": "name", "norm": "grad norm", "ratio": "update ratio", "flag": "flags"}


@dataclass(frozen=True)
class LayerRow:
    """One table row: a parameter, or a module (its parameters combined) when grouped."""

    name: str
    shape: str
    norm: float | None
    """Latest grad norm; None when non-finite (or not seen yet)."""
    ratio: float | None
    """Latest |Δw|/|w| (a module: its largest parameter's)."""
    flag: str | None
    index: int
    """Position in the parameter list (a module: its first parameter's), for a stable order."""
    search: str = ""
    """What the filter looks in besides the name (a module: its parameters' names), lower case."""


def module_of(name: str) -> str:
    """The module that owns a parameter: ``blocks.0.attn.qkv.weight`` -> ``blocks.0.attn.qkv``."""
    return name.rpartition(".")[0] or name


def combine(norms) -> float | None:
    """The norm of several tensors together, sqrt of the sum of squares; None if any is None."""
    total = 0.0
    for n in norms:
        if n is None:
            return None
        total += n * n
    return math.sqrt(total)


def shape_text(shape: list[int] | None) -> str:
    """``768×3072``; ``scalar`` for a 0-d tensor; empty when unknown."""
    if shape is None:
        return ""
    return "×".join(str(d) for d in shape) if shape else "scalar"


class LayerStats:
    """The latest per-parameter gradient statistics and a short history of each norm.

    ``version`` is bumped on every change, so the view redraws only when data moved.
    """

    def __init__(self, history: int = HISTORY) -> None:
        self.history = history
        self.names: list[str] = []
        self.shapes: list[list[int] | None] = []
        self.steps: deque[int] = deque(maxlen=history)
        """Step of each history column, shared by every parameter."""
        self.norms: list[deque[float | None]] = []
        self.ratios: list[float | None] = []
        self.flags: dict[int, str] = {}
        self.step: int | None = None
        self.version = 0
        self._modules: dict[str, list[int]] | None = None
        self._numbered = False
        """Whether the names are placeholders, given before the real ones arrived."""

    def __len__(self) -> int:
        return len(self.names)

    def set_names(self, msg: LayerNames) -> None:
        """Take the names of the parameters that the following records describe."""
        names = [str(n) for n in msg.names]
        shapes = list(msg.shapes) if len(msg.shapes) == len(names) else None
        if self._numbered and len(names) == len(self.names):
            # Records arrived before their names: the same parameters, now named.
            self.names, self._modules = names, None
            self.shapes = shapes or self.shapes
        else:
            self._rename(names, shapes)
        self._numbered = False
        self.version += 1

    def add(self, msg: Layers) -> None:
        """Fold one message in (older steps than the newest are ignored)."""
        if self.step is not None and msg.step <= self.step:
            return
        count = len(msg.grad_norms)
        if count != len(self.names):
            # Names not known (yet) for this parameter list: number them.
            self._rename([f"param{i}" for i in range(count)], None)
            self._numbered = True
        self.step = msg.step
        self.steps.append(msg.step)
        for buffer, norm in zip(self.norms, msg.grad_norms):
            buffer.append(_finite(norm))
        if msg.update_ratios is not None and len(msg.update_ratios) == count:
            self.ratios = [_finite(r) for r in msg.update_ratios]
        self.flags = {int(i): f for i, f in msg.flags.items() if str(i).isdigit() and int(i) < count}
        self.version += 1

    def _rename(self, names: list[str], shapes: list | None) -> None:
        """Take a new parameter list, keeping the history of parameters that stay."""
        if names == self.names:
            if shapes is not None:
                self.shapes = list(shapes)
            return
        by_name = dict(zip(self.names, zip(self.norms, self.ratios, self.shapes)))
        self.norms, self.ratios, new_shapes = [], [], []
        for i, name in enumerate(names):
            norms, ratio, shape = by_name.get(name, (None, None, None))
            if norms is None:
                norms = deque([None] * len(self.steps), maxlen=self.history)
            self.norms.append(norms)
            self.ratios.append(ratio)
            new_shapes.append(shapes[i] if shapes is not None and i < len(shapes) else shape)
        self.names, self.shapes = names, new_shapes
        self._modules = None

    # ---------------------------------------------------------------------- reading

    def modules(self) -> dict[str, list[int]]:
        """Module name -> indices of its parameters, in parameter order."""
        if self._modules is None:
            groups: dict[str, list[int]] = {}
            for i, name in enumerate(self.names):
                groups.setdefault(module_of(name), []).append(i)
            self._modules = groups
        return self._modules

    def rows(self, grouped: bool = False) -> list[LayerRow]:
        """Every parameter's row, or (``grouped``) every module's, in parameter order."""
        latest = [buf[-1] if buf else None for buf in self.norms]
        if not grouped:
            return [LayerRow(name, shape_text(self.shapes[i]), latest[i], self.ratios[i], self.flags.get(i), i)
                    for i, name in enumerate(self.names)]
        out = []
        for module, members in self.modules().items():
            flags = [self.flags[i] for i in members if i in self.flags]
            ratios = [self.ratios[i] for i in members if self.ratios[i] is not None]
            out.append(LayerRow(
                module, f"{len(members)} tensor{'s' if len(members) > 1 else ''}",
                combine(latest[i] for i in members), max(ratios) if ratios else None,
                max(flags, key=FLAG_RANK.__getitem__) if flags else None, members[0],
                " ".join(self.names[i] for i in members).lower()))
        return out

    def history_of(self, name: str, grouped: bool = False) -> tuple[list[int], list[float | None]]:
        """(steps, grad norms) of one parameter, or of one module's combined norm."""
        if grouped and name in self.modules():
            members = [self.norms[i] for i in self.modules()[name]]
            return list(self.steps), [combine(column) for column in zip(*members)]
        if name in self.names:
            return list(self.steps), list(self.norms[self.names.index(name)])
        return [], []

    def recent(self, row: LayerRow, grouped: bool, width: int) -> list[float | None]:
        """The last ``width`` norms of a row (a module's combined), for its sparkline."""
        if not grouped:
            return _tail(self.norms[row.index], width)
        members = [_tail(self.norms[i], width) for i in self.modules()[row.name]]
        return [combine(column) for column in zip(*members)]


def select(rows: list[LayerRow], text: str = "", sort: str = "name") -> list[LayerRow]:
    """The rows whose name holds every word of ``text`` (any case), in ``sort`` order.

    A module row also matches when one of its parameters' names holds every word.

    ``name`` sorts alphabetically, numbered parts by number; ``norm`` and ``ratio`` put the largest first and a
    non-finite norm above everything; ``flag`` puts the loudest flag first. Ties keep the
    parameter order.
    """
    words = text.lower().split()
    if words:
        rows = [r for r in rows if all(w in r.name.lower() for w in words)
                or any(all(w in name for w in words) for name in r.search.split())]
    if sort == "name":
        return sorted(rows, key=lambda r: natural_key(r.name))
    if sort == "norm":
        return sorted(rows, key=lambda r: (-math.inf if r.norm is None and r.flag == "nonfinite"
                                           else -(r.norm if r.norm is not None else -1.0), r.index))
    if sort == "ratio":
        return sorted(rows, key=lambda r: (-(r.ratio if r.ratio is not None else -1.0), r.index))
    if sort == "flag":
        return sorted(rows, key=lambda r: (-FLAG_RANK.get(r.flag or "", 0), -(r.norm or 0.0), r.index))
    raise ValueError(f"unknown sort {sort!r}; one of {SORTS}")


_DIGITS = re.compile(r"(\d+)")


def natural_key(name: str) -> tuple:
    """Sort key that orders numbered parts by number: ``blocks.2`` before ``blocks.10``."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in _DIGITS.split(name) if part)


def _finite(value) -> float | None:
    return value if isinstance(value, (int, float)) and math.isfinite(value) else None


def _tail(buffer: deque, width: int) -> list:
    n = len(buffer)
    return [buffer[i] for i in range(max(0, n - width), n)]
