"""``ptdash doctor [RUN]``: what the training doctor found in a run. Stdlib only.

Reads the ``finding`` events from the run's store (live or finished) and prints each
with what was seen, why it matters and the fix, then the Python warnings the script
raised. Exit status: 0 without findings, 1 with findings or on an error, 2 on bad usage.
"""

from __future__ import annotations

import re
import shutil
import sqlite3
import sys
import textwrap

from ptdash.shared.store import STORE_NAME, StoreError, StoreReader

from . import runs

USAGE = "usage: ptdash doctor [RUN]"
HELP = f"""{USAGE}

Print what the training doctor found in a run: silent bugs such as gradients never
cleared, training in eval mode, parameters that never learn, a zero learning rate.
RUN is a run dir, or part of a run's name or id; default: the newest run.
Exit status: 0 when there are no findings, 1 when there are (or on an error)."""

_RANK = re.compile(r"^rank (\d+): ")


def cmd_doctor(argv: list[str]) -> int:
    """Print a run's findings; see the module docstring for the exit status."""
    if argv and argv[0] in ("-h", "--help"):
        print(HELP)
        return 0
    if len(argv) > 1 or (argv and argv[0].startswith("-")):
        print(f"ptdash: error: {USAGE} (takes at most one run)", file=sys.stderr)
        return 2
    try:
        run = runs.resolve(argv[0] if argv else None)
        with StoreReader(run.path / STORE_NAME) as reader:
            events = reader.events()
    except (LookupError, StoreError, OSError, sqlite3.Error) as exc:
        message = str(exc).strip().splitlines()
        print(f"ptdash: error: {message[0] if message else type(exc).__name__}", file=sys.stderr)
        return 1
    steps = run.info.step
    title = f"{run.path.name} ({run.state}" + (f" at step {steps}" if steps is not None else "") + ")"
    text, count = render(title, events, width=min(100, shutil.get_terminal_size((100, 24)).columns))
    print(text)
    return 1 if count else 0


def render(title: str, events: list[dict], width: int = 100) -> tuple[str, int]:
    """The report for a run's events, and its number of findings.

    A finding raised by several ranks of a DDP run is shown once, naming the ranks.
    """
    findings: dict[tuple, tuple[dict, list[int]]] = {}
    for event in events:
        if event["kind"] != "finding" or not isinstance(event.get("data"), dict):
            continue
        data = event["data"]
        match = _RANK.match(event.get("message") or "")
        rank = int(match.group(1)) if match else 0
        key = (data.get("id"), data.get("case"))
        if key in findings:
            findings[key][1].append(rank)
        else:
            findings[key] = ({**data, "step": data.get("step", event.get("step"))}, [rank])
    noun = "finding" if len(findings) == 1 else "findings"
    lines = [f"ptdash doctor: {title}: " + (f"{len(findings)} {noun}" if findings else "no findings")]
    for number, (data, ranks) in enumerate(findings.values(), 1):
        where = [f"step {data['step']}" if data.get("step") else "", data.get("source") or "",
                 f"ranks {', '.join(map(str, sorted(set(ranks))))}" if len(set(ranks)) > 1 else ""]
        where = ", ".join(w for w in where if w)
        lines += ["", f"{number}. {data.get('id', '?')}" + (f"  ({where})" if where else "")]
        for label in ("what", "why", "fix"):
            lines += textwrap.wrap(str(data.get(label) or ""), width=width, initial_indent=f"   {label}: ",
                                   subsequent_indent=" " * 8, break_on_hyphens=False) or [f"   {label}: -"]
    warnings = [e for e in events if e["kind"] == "warning" and (e.get("data") or {}).get("origin") == "python"]
    if warnings:
        lines += ["", f"Python warnings the script raised ({len(warnings)}, each shown once):"]
        lines += ["   " + textwrap.shorten(e["message"], width=width - 3, placeholder=" ...") for e in warnings]
    return "\n".join(lines), len(findings)
