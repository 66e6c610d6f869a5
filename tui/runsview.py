"""The runs view: ``ptdash`` with no script (or ``ptdash runs``) lists this directory's runs
(and the live ones anywhere) in the terminal: name, state, steps, loss, started, parent.

``/`` filters the list (every word typed must be in the run's name, state or parent), Space
marks a run, Enter opens the marked runs overlaid, as ``ptdash show A B`` does (the first
marked is the main one), or the run under the cursor when none is marked; a live run opened
alone is attached to. This module holds the list's rows (``run_rows``) and its filter
(``matching``), with no Textual; ``widgets/runs_app.py`` is the app, whose ``run()``
returns the run dirs chosen (``[]`` on quit).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ptdash.shared import names
from ptdash.shared.reader import StoreReader
from ptdash.shared.store import STORE_NAME, StoreError

from .runs import RunSummary


@dataclass(frozen=True)
class RunRow:
    """One run as the list shows it."""

    path: Path
    name: str
    state: str
    step: int | None
    loss: float | None
    started: float
    parent: str
    live: bool


def _newest_loss(path: Path) -> float | None:
    try:
        with StoreReader(path / STORE_NAME) as reader:
            return reader.newest([names.LOSS]).get(names.LOSS, (None, None))[1]
    except StoreError:
        return None


def run_rows(found: list[RunSummary]) -> list[RunRow]:
    """The list's rows, newest run first, each with its newest stored loss."""
    rows = []
    for run in sorted(found, key=lambda r: r.started, reverse=True):
        parent = Path(run.info.parent).name if run.info.parent else ""
        if parent and run.info.fork_step is not None:
            parent += f" @{run.info.fork_step:,}"
        rows.append(RunRow(run.path, run.info.name, run.state, run.step, _newest_loss(run.path), run.started,
                           parent, run.live))
    return rows


def matching(rows: list[RunRow], text: str) -> list[RunRow]:
    """The rows whose name (or dir), state or parent holds every word of ``text`` (any case)."""
    words = text.lower().split()
    return [r for r in rows if all(w in f"{r.name} {r.path.name} {r.state} {r.parent}".lower() for w in words)]
