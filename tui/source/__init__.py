"""Where the dashboard's data comes from: the ``Source`` contract and what a source delivers.

A source is a plain class with its own threads, no Textual: ``start(post)`` returns at
once and the source calls ``post(obj)`` from its own thread with what it learns, in order:

- one ``History`` (everything the store held when the source looked),
- then live protocol messages (``Metrics``, ``Status``, ``Ack``, ``Event``, ``LayerNames``, ``Layers``,
  ``Schedule``),
  ``Backfill`` (rows read back from the store to fill a gap in the live stream),
  ``LogLines`` (new lines of the script's output.log), ``InfoChanged`` (run.json changed)
  and ``Connection`` (the link to the engine came up, went down, or never will).

The app must treat ``post`` as called from a foreign thread. The sources: ``live.LiveSource``
(a running engine) and ``replay.ReplaySource`` (a run's files, read-only); ``history``
reads the store, ``logtail`` follows output.log.
"""

from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ptdash.shared import rundir
from ptdash.shared.config import RunInfo
from ptdash.shared.protocol import Command, Event, LayerNames, Layers, Schedule, Status

Columns = dict[str, tuple[list[int], list[float | None]]]
"""``{series name: (steps, values)}``, as the store reader returns a series."""


# -------------------------------------------------------------------------- deliveries


@dataclass
class History:
    """The run as stored when the source attached."""

    info: RunInfo | None
    """run.json (None while it is missing or unreadable)."""
    series: Columns
    walls: tuple[list[int], list[float]]
    """(steps, wall times) of rank 0, for elapsed time and steps/s."""
    events: list[Event]
    status: Status | None
    """The status the files describe (None before the engine wrote any)."""
    meta: dict = field(default_factory=dict)
    pending: list[str] = field(default_factory=list)
    """Series left out to show the charts sooner; a Backfill with them follows."""
    layers: list[Layers] = field(default_factory=list)
    """The newest stored per-parameter records, oldest first."""
    layer_names: LayerNames | None = None
    """The parameter names those records follow."""
    ranks: dict[int, Columns] = field(default_factory=dict)
    """Per rank above 0, the series the Ranks tab reads (decimated to ``history.RANK_POINTS``)."""
    samples: dict[int, Columns] = field(default_factory=dict)
    """Per rank, host and GPU readings taken by time: ``{name: (walls, values)}``."""
    schedule: Schedule | None = None
    """The newest stored LR schedule ahead (or the note saying why there is none)."""


@dataclass
class Backfill:
    """Rows read back from the store for steps the live stream dropped or missed."""

    series: Columns
    walls: tuple[list[int], list[float]]
    ranks: dict[int, Columns] = field(default_factory=dict)
    """Per rank above 0, new rows of the series the Ranks tab reads."""
    samples: dict[int, Columns] = field(default_factory=dict)
    """Per rank, new host and GPU readings: ``{name: (walls, values)}``."""


@dataclass
class InfoChanged:
    """run.json as read now: failed ranks, end time."""

    info: RunInfo
    world_size: int | None = None
    """The ranks the engine's Welcome named on connecting (None when this came from the file alone)."""


@dataclass
class LogLines:
    """New complete lines of output.log."""

    lines: list[str]


@dataclass
class Connection:
    """The link to the engine changed: ``connected``, and a short note for the header."""

    connected: bool
    note: str


Post = Callable[[object], None]


# ------------------------------------------------------------------------------ source


class Source:
    """The contract the dashboard reads: start, send, close, and capability flags.

    Capability flags the app reads: ``live`` (the source follows a running engine and
    may control it), ``can_control`` (commands can be sent now: live and connected).
    """

    live: bool = False
    can_control: bool = False

    def __init__(self, run_dir: Path | str) -> None:
        self.run_dir = Path(run_dir)
        self.info: RunInfo | None = read_run_info(self.run_dir)
        """run.json as last read (None while it is missing or unreadable)."""

    @property
    def name(self) -> str:
        """The run's name, for the header (its directory's name until run.json says)."""
        return (self.info.name if self.info is not None else "") or self.run_dir.name

    def start(self, post: Post) -> None:
        """Begin delivering to ``post`` from a background thread; returns at once."""
        raise NotImplementedError

    def send(self, command: Command) -> None:
        """Queue a command for the engine; never blocks. Ignored when it cannot control."""

    def close(self) -> None:
        """Stop the background thread, after sending what was queued (briefly)."""


def read_run_info(run_dir: Path) -> RunInfo | None:
    """run.json, or None while it is missing or unreadable (a source keeps looking)."""
    try:
        return rundir.read_info(run_dir)
    except (FileNotFoundError, ValueError):
        return None


_ids = itertools.count(1)


def new_command_id() -> str:
    """A command id unique across dashboards attached to the same run."""
    return f"{os.getpid()}-{int(time.time() * 1000) % 100000000}-{next(_ids)}"
