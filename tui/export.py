"""``ptdash export RUN --format csv|jsonl|tensorboard``: a run's history for other tools.

- ``csv``: a header, then one row per step: ``step``, ``wall`` (Unix time), and one
  column per scalar series; under DDP the other ranks' series follow as ``rankN/<name>``;
  with ``--layers`` each parameter's ``layer/<name>/grad_norm`` and ``.../update_ratio``.
  An empty cell is a step without that value (or a non-finite one: the store keeps None).
- ``jsonl``: one JSON object per step with the same names (only the values the step
  has); with ``--events`` also one object per event (``{"event": kind, ...}``) and per
  entry of the command journal (``{"command": name, ...}``), each after its step's row.
- ``tensorboard``: event files written by the tensorboard package's own writer
  (``export_tb``).
- the host and GPU readings, taken once a second by time rather than by step
  (``--samples``): in CSV instead of the steps, one row per reading (``wall, rank``, one
  column per name); in JSON lines as ``{"sample": wall, "rank": r, name: value...}`` in
  time order among the steps; in TensorBoard always, each at the newest step before it.

Streaming: rows are read one window of steps at a time (``RowReader.rows``) and written
as they come, so memory does not grow with the run's length; a run still training is
exported up to the step it had reached when the export began. Progress goes to stderr;
a file is written beside its destination and renamed into place when complete.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from ptdash.shared.events import CommandAnswer, read
from ptdash.shared.protocol import Event
from ptdash.shared.rows import WINDOW, Column, RowReader
from ptdash.shared.store import STORE_NAME, StoreError

from . import runs
from .errors import CliError


def cmd_export(args: argparse.Namespace, window: int = WINDOW) -> int:
    """Export one run as ``args`` say (see the module docstring); exit status 0, 1 on a damaged store."""
    if args.events and args.format != "jsonl":
        raise CliError("--events goes with --format jsonl (a tensorboard export always carries the events, as text)")
    if args.format == "tensorboard":
        from . import export_tb

        export_tb.check_installed()
    run = runs.resolve(args.run, everywhere=True)
    try:
        reader = RowReader(run.path / STORE_NAME)
    except StoreError as exc:
        raise CliError(str(exc), 1) from None
    with reader:
        columns = reader.columns(layers=args.layers)
        last = max((s for s in map(reader.last_step, reader.ranks()) if s is not None), default=None)
        progress = Progress(run.path.name, last)
        rows = progress.follow(reader.rows(columns, window=window, last_step=last))
        events = reader.events() if args.events or args.format == "tensorboard" else []
        samples = sample_rows(reader) if args.samples or args.format == "tensorboard" else []
        if args.format == "tensorboard":
            out = Path(args.output) if args.output else Path("tb") / run.path.name
            export_tb.write(out, columns, rows, events, samples)
        else:
            with _destination(args.output) as stream:
                if args.format == "csv" and args.samples:
                    write_samples_csv(stream, samples)
                elif args.format == "csv":
                    write_csv(stream, columns, rows)
                else:
                    write_jsonl(stream, columns, rows, events, samples)
            out = args.output if args.output and args.output != "-" else "stdout"
        if args.format == "csv" and args.samples:
            progress.done(f"wrote {out}: {len(samples):,} readings of {len({n for _, _, v in samples for n in v})} series")
        else:
            progress.done(f"wrote {out}: {progress.count:,} steps, {len(columns)} series"
                          + (f", {len(samples):,} readings" if samples else ""))
        if reader.damage is not None:
            print(f"ptdash: warning: {reader.damage}; {_salvage(reader)}", file=sys.stderr)
            return 1
    return 0


def _salvage(reader: RowReader) -> str:
    """What a damaged store's export holds: read around the damaged pages, or up to the damage."""
    if reader.unread is None:
        return "exported what was read before it"
    values, first, last = reader.unread
    return (f"exported everything else: {values:,} step(s) of series between steps {first:,} and {last:,} "
            "are on damaged pages and left out")


def write_csv(stream, columns: list[Column], rows) -> None:
    """The CSV export: a header row, then ``step, wall, values...`` per step (empty: no value)."""
    out = csv.writer(stream, lineterminator="\n")
    out.writerow(["step", "wall", *(c.label for c in columns)])
    # The csv module writes a float as its repr, which reads back as the same float.
    for step, wall, values in rows:
        out.writerow((step, wall, *values))


def sample_rows(reader) -> list[tuple[int, float, dict]]:
    """Every reading taken by time: ``(rank, wall, {name: value})`` in time order."""
    by_time: dict[tuple[float, int], dict] = {}
    for rank in reader.ranks() or [0]:
        for name in reader.sampled_names(rank):
            for wall, value in zip(*reader.sampled(name, rank)):
                if value is not None:
                    by_time.setdefault((wall, rank), {})[name] = value
    return [(rank, wall, values) for (wall, rank), values in sorted(by_time.items())]


def write_samples_csv(stream, samples: list[tuple[int, float, dict]]) -> None:
    """The CSV export of the readings: ``wall, rank``, then one column per name."""
    names = sorted({name for _, _, values in samples for name in values})
    out = csv.writer(stream, lineterminator="\n")
    out.writerow(["wall", "rank", *names])
    for rank, wall, values in samples:
        out.writerow((wall, rank, *(values.get(n, "") for n in names)))


def sample_line(rank: int, wall: float, values: dict) -> str:
    return json.dumps({"sample": wall, "rank": rank, **values}, allow_nan=False) + "\n"


def write_jsonl(stream, columns: list[Column], rows, events: list[Event], samples=()) -> None:
    """The JSON-lines export: one object per step, each event after its step's row, each
    reading (``samples``) before the first step that ended after it."""
    labels = [c.label for c in columns]
    pending = sorted(events, key=lambda e: (e.step if e.step is not None else -1, e.id))
    at = taken = 0
    for step, wall, values in rows:
        while at < len(pending) and (pending[at].step or 0) < step:
            stream.write(event_line(pending[at]))
            at += 1
        while taken < len(samples) and wall is not None and samples[taken][1] <= wall:
            stream.write(sample_line(*samples[taken]))
            taken += 1
        row = {"step": step, "wall": wall}
        row.update((k, v) for k, v in zip(labels, values) if v is not None)
        stream.write(json.dumps(row, allow_nan=False) + "\n")
    for event in pending[at:]:
        stream.write(event_line(event))
    for sample in samples[taken:]:
        stream.write(sample_line(*sample))


def event_line(event: Event) -> str:
    """One event as a JSON line; a command's answer as an entry of the command journal."""
    answer = read(event)
    if isinstance(answer, CommandAnswer) and answer.name:
        obj = {"command": answer.name, "value": answer.value, "ok": answer.ok, "applied_step": answer.applied_step,
               "id": answer.id}
    else:
        obj = {"event": event.kind, "data": event.data}
    obj.update(step=event.step, wall=event.wall, rank=event.rank, message=event.message)
    return json.dumps(obj, allow_nan=False) + "\n"


@contextmanager
def _destination(path: str | None):
    """stdout for None or ``-``; else a temporary file beside ``path``, renamed onto it when complete."""
    if path is None or path == "-":
        yield sys.stdout
        sys.stdout.flush()
        return
    target = Path(path)
    if target.is_dir():
        raise CliError(f"-o {path} is a directory; name a file", 2)
    if not target.parent.is_dir():
        raise CliError(f"-o {path}: no directory {target.parent}", 2)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", newline="") as stream:
            yield stream
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


class Progress:
    """How far an export is, on stderr: redrawn in place on a terminal, a line every few seconds otherwise."""

    def __init__(self, name: str, last: int | None, stream=None, every: float | None = None) -> None:
        self.name = name
        self.last = last
        self.stream = stream or sys.stderr
        self.count = 0
        """Rows written so far."""
        self._tty = self.stream.isatty()
        self._every = every if every is not None else 0.2 if self._tty else 5.0
        self._next = time.monotonic() + self._every
        self._first: int | None = None

    def follow(self, rows):
        """``rows``, passed through, counting them and reporting now and then."""
        for row in rows:
            self.count += 1
            if self._first is None:
                self._first = row[0]
            if time.monotonic() >= self._next:
                self._report(row[0])
            yield row

    def _report(self, step: int) -> None:
        self._next = time.monotonic() + self._every
        share = ""
        if self.last is not None and self._first is not None and self.last > self._first:
            share = f" ({100 * (step - self._first) / (self.last - self._first):.0f}%)"
        text = f"[ptdash] exporting {self.name}: step {step:,} of {self.last or 0:,}{share}"
        self.stream.write(f"\r{text}\x1b[K" if self._tty else text + "\n")
        self.stream.flush()

    def done(self, text: str) -> None:
        """The closing line."""
        self.stream.write(("\r\x1b[K" if self._tty else "") + f"[ptdash] {text}\n")
        self.stream.flush()
