"""The TensorBoard export: event files written by the ``tensorboard`` package's own writer.

``EventFileWriter`` (``tensorboard.summary.writer``) writes the records; each step is one
``Event`` holding a ``Summary`` with one scalar per series, tagged with its ptdash name
(``loss``, ``opt/lr/group0``, ``layer/<param>/grad_norm``) and stamped with the step's
wall time. TensorBoard keeps a scalar as a 32-bit float, which holds a float32 loss
exactly. Under DDP each rank gets a subdirectory (``rank0/``, ``rank1/``...), which
TensorBoard shows as runs to overlay; a run of one rank writes straight into the
directory. The run's events (and its command journal) are text summaries under the tag
``events``. The host and GPU readings, taken by time, are scalars under their own names
(``host/rss_bytes``, ``gpu0/...``), each at the newest step that ended before it, with
its own wall time.

The tensorboard package is an optional extra, imported only here and only when an
export asks for it; it never loads torch (``torch.utils.tensorboard`` would).
"""

from __future__ import annotations

from pathlib import Path

from ptdash.shared import names
from ptdash.shared.protocol import Event
from ptdash.shared.rows import Column

from .errors import CliError

HINT = "the tensorboard export needs the tensorboard package: pip install 'ptdash[tensorboard]'"

EVENTS_TAG = "events"


def check_installed() -> None:
    """Raise a one-line CliError naming the extra when the tensorboard package is missing."""
    try:
        import tensorboard.summary.writer.event_file_writer  # noqa: F401
    except ImportError:
        raise CliError(HINT, 1) from None


def write(out: Path, columns: list[Column], rows, events: list[Event], samples=()) -> None:
    """Write ``rows`` (``RowReader.rows`` of ``columns``), ``events`` and ``samples``
    (``(rank, wall, {name: value})`` in time order) as event files under ``out``."""
    from tensorboard.compat.proto.event_pb2 import Event as TbEvent
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.plugins.text.summary_v2 import text_pb
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    if out.is_dir() and any(out.rglob("events.out.tfevents.*")):
        raise CliError(f"{out} already holds TensorBoard event files (TensorBoard would mix them): "
                       "remove it or name another with -o", 2)
    ranks = sorted({c.rank for c in columns} | {e.rank for e in events} | {r for r, _, _ in samples}) or [0]
    dirs = {rank: out if len(ranks) == 1 else out / f"rank{rank}" for rank in ranks}
    writers = {rank: EventFileWriter(str(path)) for rank, path in dirs.items()}
    tags = [(c.rank, c.series if c.field is None else names.layer(c.series, c.field)) for c in columns]
    pending = sorted(events, key=lambda e: (e.step if e.step is not None else -1, e.id))
    at = taken = 0
    last_step = 0

    def readings_until(wall: float | None) -> None:
        nonlocal taken
        while taken < len(samples) and (wall is None or samples[taken][1] <= wall):
            rank, when, values = samples[taken]
            found = [Summary.Value(tag=name, simple_value=value) for name, value in sorted(values.items())]
            writers[rank].add_event(TbEvent(step=last_step, wall_time=when, summary=Summary(value=found)))
            taken += 1

    try:
        for step, wall, values in rows:
            while at < len(pending) and (pending[at].step or 0) <= step:
                _text(writers, pending[at], TbEvent, text_pb)
                at += 1
            if wall is not None:
                readings_until(wall)
            last_step = step
            by_rank: dict[int, list] = {}
            for (rank, tag), value in zip(tags, values):
                if value is not None:
                    by_rank.setdefault(rank, []).append(Summary.Value(tag=tag, simple_value=value))
            for rank, found in by_rank.items():
                writers[rank].add_event(TbEvent(step=step, wall_time=wall or 0.0, summary=Summary(value=found)))
        for event in pending[at:]:
            _text(writers, event, TbEvent, text_pb)
        readings_until(None)
    finally:
        for writer in writers.values():
            writer.close()


def _text(writers: dict, event: Event, TbEvent, text_pb) -> None:
    """One event (a command's answer included) as a text summary, on its rank's writer."""
    writer = writers.get(event.rank) or writers[min(writers)]
    text = f"{event.kind}: {event.message}" + (f" (rank {event.rank})" if event.rank else "")
    writer.add_event(TbEvent(step=event.step or 0, wall_time=event.wall, summary=text_pb(EVENTS_TAG, text)))
