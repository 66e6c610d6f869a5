"""What a run dir holds now, read for the dashboard: history on attach, more series, ranks, status.

Plain functions over ``ptdash.shared``'s StoreReader and run.json; each source calls them
from its own thread. Long series are decimated in SQL, so attaching to a run of a
million steps reads a few thousand points per series.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path

from ptdash.shared import names
from ptdash.shared.config import RunInfo
from ptdash.shared.protocol import Event, LayerNames, Layers, Status
from ptdash.shared.reader import StoreReader
from ptdash.shared.store import STORE_NAME, StoreError

from ..series import rank_wants
from . import Backfill, Columns, History, read_run_info

HISTORY_POINTS = 4000
"""Points per series read from the store on (re)attach; decimated in SQL beyond that."""

FIRST_SERIES = (names.LOSS, names.MICRO_BATCHES, names.GRAD_NORM, names.CLIP_MAX, names.CLIPPED, names.STEP_S,
                names.SAMPLES_PER_S)
"""The series the first screen charts, of every optimizer, with the LRs; they are read first
on attach, since decimating a long series costs a scan of it (about a second per million steps)."""


def first_screen(name: str) -> bool:
    """Whether the first screen charts series ``name``."""
    index, base = names.optimizer_of(name)
    return base in FIRST_SERIES or index > 0 or names.parse_lr(name) is not None

LAYER_FLUSHES = 300
"""Newest per-parameter gradient records (one per engine flush) read on attach."""

RANK_POINTS = 1000
"""Points per series of each rank above 0 read on attach (the few series the Ranks tab reads)."""

SAMPLE_POINTS = 600
"""Host and GPU readings per series read on attach (the System tab shows the latest)."""

def rank_sample(name: str) -> bool:
    """Whether the Ranks tab reads this reading of every rank: its memory."""
    gpu = names.parse_gpu(name)
    return name == names.HOST_RSS or (gpu is not None and gpu[1] == "mem_allocated_bytes")

HISTORY_WALLS = 1000
"""Newest step wall times read on attach (for steps/s; elapsed time comes from run.json)."""


def load_history(run_dir: Path, first: Callable[[str], bool] | None = first_screen) -> History:
    """What the run dir holds now; an empty History when the store is not there yet.

    With ``first`` (which series to read now), only those series are read and the others
    are listed in ``History.pending`` for ``load_series``; with None, every series is read.
    """
    info = read_run_info(run_dir)
    series: Columns = {}
    walls: tuple[list[int], list[float]] = ([], [])
    events: list[Event] = []
    meta: dict = {}
    pending: list[str] = []
    layers: list[Layers] = []
    layer_names: LayerNames | None = None
    ranks: dict[int, Columns] = {}
    samples: dict[int, Columns] = {}
    schedule = None
    damage: StoreError | None = None
    try:
        reader = StoreReader(Path(run_dir) / STORE_NAME)
    except StoreError as exc:
        reader = None
        if (Path(run_dir) / STORE_NAME).exists():
            damage = exc
    if reader is not None:
        with reader:
            for name in reader.names():
                if first is None or first(name):
                    series[name] = reader.series(name, max_points=HISTORY_POINTS)
                else:
                    pending.append(name)
            last = reader.last_step()
            walls = reader.walls(after_step=None if last is None else last - HISTORY_WALLS)
            events = reader.events()
            meta = reader.meta()
            layers = reader.layers(limit=LAYER_FLUSHES)
            layer_names = reader.layer_names(layers[-1].step) if layers else None
            schedule = reader.schedule()
            size = world_size(info, meta)
            others = list(range(1, size)) if size else [r for r in reader.ranks() if r != 0]
            ranks = load_ranks(reader, others)
            samples = load_samples(reader, [0, *others])
            damage = reader.damage
    if damage is not None:  # shown in the events pane: what was read, and where it stopped
        events.append(Event(kind="warning", step=None, wall=time.time(), message=str(damage)))
    last_step = walls[0][-1] if walls[0] else None
    status = status_from_files(info, last_step) if info is not None else None
    return History(info=info, series=series, walls=walls, events=events, status=status, meta=meta,
                   pending=pending, layers=layers, layer_names=layer_names, ranks=ranks, samples=samples,
                   schedule=schedule)


def world_size(info: RunInfo | None, meta: dict) -> int | None:
    """The run's number of ranks as run.json or the store's meta recorded it; None when neither did."""
    for size in (info.world_size if info is not None else None, meta.get("world_size")):
        if isinstance(size, int) and not isinstance(size, bool) and size >= 1:
            return size
    return None


def load_ranks(reader: StoreReader, ranks: Iterable[int],
               after: dict[tuple[int, str], int] | None = None) -> dict[int, Columns]:
    """``{rank: {name: (steps, values)}}`` of the series the Ranks tab reads, for ``ranks``.

    With ``after`` (``(rank, name)`` -> step), only newer rows; ranks and series without
    any are left out.
    """
    names = [n for n in reader.names() if rank_wants(n)]
    out: dict[int, Columns] = {}
    for rank in ranks:
        own = {}
        for name in names:
            steps, values = reader.series(name, rank=rank, max_points=RANK_POINTS,
                                          after_step=None if after is None else after.get((rank, name), -1))
            if steps:
                own[name] = (steps, values)
        if own:
            out[rank] = own
    return out


def load_samples(reader: StoreReader, ranks: Iterable[int], after: dict[int, float] | None = None) -> dict[int, Columns]:
    """``{rank: {name: (walls, values)}}`` of the readings taken by time: every one of rank
    0's, the memory of the others. With ``after`` (rank -> wall), only newer readings."""
    out: dict[int, Columns] = {}
    for rank in ranks:
        own = {}
        for name in (n for n in reader.sampled_names(rank) if rank == 0 or rank_sample(n)):
            walls, values = reader.sampled(name, rank, after_wall=None if after is None else after.get(rank),
                                           max_points=SAMPLE_POINTS)
            if walls:
                own[name] = (walls, values)
        if own:
            out[rank] = own
    return out


def load_series(run_dir: Path, names: list[str]) -> Backfill:
    """The whole (decimated) history of ``names``, as a Backfill."""
    series = {}
    try:
        reader = StoreReader(Path(run_dir) / STORE_NAME)
    except StoreError:
        return Backfill({}, ([], []))
    with reader:
        for name in names:
            series[name] = reader.series(name, max_points=HISTORY_POINTS)
    return Backfill(series, ([], []))


def status_from_files(info: RunInfo, last_step: int | None) -> Status:
    """The Status a run dir describes, for a run the dashboard cannot ask."""
    return Status(
        state=info.status,
        step=max(last_step or 0, info.step or 0),
        total_steps=info.total_steps,
        paused_at=info.paused_at,
        clip=info.clip,
        lr_scale=info.lr_scale or 1.0,
        exit_code=info.exit_code,
        detail=info.detail or info.error or "",
    )
