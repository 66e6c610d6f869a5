"""``ptdash doctor [RUN]``: what the training doctor found in a run. No Textual: plain text out.

Reads the ``finding`` events from the run's store (live or finished) and prints each
with what was seen, why it matters and the fix, then every anomaly and what was done about
it (incidents.py: each rollback, skip, pause), the Python warnings the script
raised and the metrics read from its output (printed.py: each name's first value and its
line, so a wrong guess is seen) (``--json``: all of it as one JSON object). Exit status: 0 without findings, 1 with
findings or on an error, 2 on bad usage.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sqlite3
import sys
import textwrap

from ptdash.shared import integrity
from ptdash.shared.events import PrintedMetric, Warned, read
from ptdash.shared.protocol import Event
from ptdash.shared.reader import StoreReader
from ptdash.shared.store import STORE_NAME, StoreError

from . import runs, subcommands
from .errors import CliError
from .findings import Finding, Findings
from .incidents import Incidents, listing


def cmd_doctor(argv: list[str]) -> int:
    """Print a run's findings (``--json``: as one object); see the module docstring for the exit status."""
    try:
        args = subcommands.parse("doctor", argv)
    except CliError as exc:
        print(f"ptdash: error: {exc}", file=sys.stderr)
        return exc.code
    try:
        run = runs.resolve(args.run)
        with StoreReader(run.path / STORE_NAME) as reader:
            events, newest = reader.events(), reader.last_step()
    except (LookupError, StoreError, OSError, ValueError, sqlite3.Error) as exc:  # ValueError: a damaged run.json
        message = str(exc).strip().splitlines()
        print(f"ptdash: error: {message[0] if message else type(exc).__name__}", file=sys.stderr)
        return 1
    damage = integrity.check(run.path / STORE_NAME).damage
    # run.json's step is the one of its newest change of state; a live run's store is newer.
    steps = max((s for s in (run.info.step, newest) if s is not None), default=None)
    until = {"ended_at": run.info.ended, "live": run.live}  # how long a stall the engine did not end lasted
    if args.json:
        found, warnings = fold(events, **until)
        print(json.dumps({"run_dir": str(run.path), "name": run.info.name, "state": run.state, "step": steps,
                          "findings": [dataclasses.asdict(f) for f in found],
                          "anomalies": [row.to_data() for row in _incidents(events).rows],
                          "warnings": [e.message for e in warnings],
                          "printed": [{"step": e.step, "rank": e.rank, **dataclasses.asdict(read(e))}
                                      for e in _printed(events)],
                          "damage": damage}, indent=2))
        return 1 if found or damage else 0
    title = f"{run.path.name} ({run.state}" + (f" at step {steps}" if steps is not None else "") + ")"
    text, count = render(title, events, width=min(100, shutil.get_terminal_size((100, 24)).columns), **until)
    print(text)
    if damage:
        print(f"\nThe run's history is damaged: {damage}")
    return 1 if count or damage else 0


def fold(events: list[Event], ended_at: float | None = None, live: bool = False) -> tuple[list[Finding], list[Event]]:
    """The findings in ``events`` in the order raised (one per rule, naming its ranks; a stall the
    engine could not end measured to the run's end, ``ended_at``, or to now while ``live``), and
    the script's own Python warnings."""
    folded = Findings()
    for event in events:
        folded.add(event)
    warnings = [e for e in events if _python_warning(e)]
    return folded.newest_first(ended_at, live)[::-1], warnings


def _python_warning(event: Event) -> bool:
    what = read(event)
    return isinstance(what, Warned) and what.origin == "python"


def render(title: str, events: list[Event], width: int = 100, ended_at: float | None = None,
           live: bool = False) -> tuple[str, int]:
    """The report for a run's events, and its number of findings.

    A finding raised by several ranks of a DDP run is shown once, naming the ranks (the
    same fold as the Doctor tab's).
    """
    found, warnings = fold(events, ended_at, live)
    incidents = _incidents(events)
    noun = "finding" if len(found) == 1 else "findings"
    lines = [f"ptdash doctor: {title}: " + (f"{len(found)} {noun}" if found else "no findings")
             + (f", {len(incidents)} anomal{'y' if len(incidents) == 1 else 'ies'}" if incidents.rows else "")]
    for number, finding in enumerate(found, 1):
        ranks = sorted(set(finding.ranks))
        where = [f"step {finding.step}" if finding.step else "", finding.source or "",
                 f"ranks {', '.join(map(str, ranks))}" if len(ranks) > 1 else ""]
        where = ", ".join(w for w in where if w)
        lines += ["", f"{number}. {finding.id}" + (f"  ({where})" if where else "")]
        for label, text in (("what", finding.what), ("why", finding.why), ("fix", finding.fix)):
            lines += textwrap.wrap(text, width=width, initial_indent=f"   {label}: ",
                                   subsequent_indent=" " * 8, break_on_hyphens=False) or [f"   {label}: -"]
    if incidents.rows:  # every anomaly and what was done about it: the run's own story of its bad steps
        lines += ["", f"Anomalies and what was done ({len(incidents)}):"]
        for line in listing(incidents.rows):
            lines += textwrap.wrap(line, width=width, initial_indent="   ", subsequent_indent=" " * 6,
                                   break_on_hyphens=False)
    if warnings:
        lines += ["", f"Python warnings the script raised ({len(warnings)}, each shown once):"]
        lines += ["   " + textwrap.shorten(e.message, width=width - 3, placeholder=" ...") for e in warnings]
    printed = _printed(events)
    if printed:  # what was read from the output, and the line it came from: a wrong guess is seen here
        said = [read(e) for e in printed]
        named = {d.name for d in said if d.left_out is None}
        left = {d.name for d in said if d.left_out is not None}
        count = f"{len(named)} found" + (f", {len(left & named)} of them left out" if left & named else "") + \
            (f", {len(left - named)} more left out" if left - named else "")
        lines += ["", f"Metrics read from the script's output ({count}; --no-parse-output turns it off):"]
        lines += ["   " + textwrap.shorten(e.message.replace("found printed metric ", ""), width=width - 3,
                                           placeholder=" ...") for e in printed]
    return "\n".join(lines), len(found)


def _incidents(events: list[Event]) -> Incidents:
    """The anomalies, rollbacks, skips and pauses in ``events``, folded across ranks."""
    folded = Incidents()
    for event in events:
        folded.add(event)
    return folded


def _printed(events: list[Event]) -> list[Event]:
    """The printed-metric events: each name's first value (per rank) and those left out."""
    return [e for e in events if isinstance(read(e), PrintedMetric)]
