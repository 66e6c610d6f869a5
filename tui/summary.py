"""``ptdash show RUN --once``: a run summed up in plain text or JSON, with no terminal needed.

Status, steps, duration and rate, the first, last and best loss, the last LR, the
gradient norm's range, at how many steps the store kept the total norm, the per-layer
norms and the update ratios, the metrics the script printed (last, min, max), every change of the
clip norm or the LR factor, every anomaly and what was done about it (incidents.py: each
rollback, skip, pause), the doctor's findings and where the checkpoints are. Read from run.json and the store (live or
finished): a series' extremes come from the store's summary table, so a run of a
million steps is summed up in a fraction of a second. Plain text: no escape codes,
whatever stdout is.
"""

from __future__ import annotations

import json
import re
import statistics
import time
from pathlib import Path

from ptdash.shared import events, integrity, names
from ptdash.shared.exits import describe_exit
from ptdash.shared.protocol import ENDED
from ptdash.shared.rows import RowReader
from ptdash.shared.store import STORE_NAME, StoreError

from .findings import Findings
from .incidents import Incident, Incidents, listing
from .fmt import fmt_duration, fmt_si
from .runs import RunSummary
from .tabs.system import cost_line, kept_line, sampling_line

_CHECKPOINT = re.compile(r"^step-(\d+)\.pt$")
PRINTED_SHOWN = 8
"""Printed metrics the plain text lists (JSON: all)."""


def summarize(run: RunSummary) -> dict:
    """The summary of ``run`` as a JSON-ready dict (None wherever the run cannot say)."""
    info = run.info
    out = {"name": info.name, "id": info.id, "run_dir": str(run.path), "state": run.state, "status": info.status,
           "exit_code": info.exit_code, "exit": describe_exit(info.exit_code) if info.exit_code is not None else None,
           "step": run.step, "total_steps": info.total_steps, "started": info.started or info.created or None,
           "ended": info.ended, "duration_s": None, "steps_per_s": None, "loss": None, "lr": None,
           "grad_norm": None, "printed": [], "changes": [], "anomalies": [], "findings": [],
           "checkpoints": _checkpoints(run.path),
           "cost": None, "kept": None, "damage": None, "integrity": None,
           "parent": {"run_dir": info.parent, "id": info.parent_id, "step": info.fork_step} if info.parent else None}
    try:
        reader = RowReader(run.path / STORE_NAME)
    except StoreError as exc:
        out["damage"] = str(exc) if (run.path / STORE_NAME).exists() else None
        return out
    with reader:
        first, last = reader.wall_range()
        start = out["started"] or (first[1] if first else None)
        if info.status in ENDED:
            end = info.ended or (last[1] if last else None)
        else:  # a live run has lasted until now; a lost one until its last step
            end = time.time() if run.live else (last[1] if last else None)
        if start is not None and end is not None and end >= start:
            out["duration_s"] = end - start
        if first and last and last[1] > first[1]:
            out["steps_per_s"] = (last[0] - first[0]) / (last[1] - first[1])
        loss = reader.stats(names.LOSS)
        if loss is not None:
            out[names.LOSS] = {"first": _point(loss.first), "last": _point(loss.last), "best": _point(loss.low)}
        lrs = names.lr_names(reader.names())
        lr = reader.stats(lrs[0]) if lrs else None
        if lr is not None:
            out["lr"] = {"name": lrs[0], **_point(lr.last)}
        norm = reader.stats(names.GRAD_NORM)
        if norm is not None:
            out["grad_norm"] = {"min": _point(norm.low), "max": _point(norm.high), "last": _point(norm.last)}
        out["printed"] = _printed(reader)
        out["cost"] = _cost(reader)
        out["kept"] = reader.kept()  # what the store holds, over every attempt of the run
        findings, incidents = Findings(), Incidents()
        for event in reader.events():
            findings.add(event)
            incidents.add(event)
            answer = events.read(event)
            if isinstance(answer, events.CommandAnswer) and answer.ok and answer.name in ("clip", "lr_scale"):
                step = answer.applied_step if answer.applied_step is not None else event.step
                out["changes"].append({"name": answer.name, "value": answer.value, "step": step})
        out["anomalies"] = [row.to_data() for row in incidents.rows]
        out["findings"] = [{"id": f.id, "severity": f.severity, "what": f.what, "step": f.step, "ranks": f.ranks,
                            **({k: f.extra.get(k) for k in ("seconds", "over", "with_run")} if f.id == "stalled"
                               else {})}
                           for f in findings.newest_first(info.ended, run.live)[::-1]]
        out["damage"] = str(reader.damage) if reader.damage else None
    if out["damage"] is None:  # the reads above go around a damaged middle: every page is checked
        found = integrity.check(run.path / STORE_NAME, limit_bytes=integrity.SHOW_LIMIT_BYTES)
        out["damage"] = found.damage
        out["integrity"] = found.skipped or None
    return out


def _printed(reader) -> list[dict]:
    """The metrics the script printed (``printed/<name>``): the held-out ones first, then by name."""
    found = sorted((n for n in map(names.parse_printed, reader.names()) if n is not None),
                   key=lambda n: (not names.held_out(n), n))
    out = []
    for name in found:
        stats = reader.stats(names.printed(name))
        if stats is not None:
            out.append({"name": name, "series": names.printed(name), "last": _point(stats.last),
                        "min": _point(stats.low), "max": _point(stats.high)})
    return out


def _cost(reader) -> dict | None:
    """ptdash's own cost as the engine measured it (budget.py): the median of its readings
    over the run, the sampling periods at the end. None for a run without the readings."""
    latest = reader.latest_samples()
    shares = [v for v in reader.sampled(names.STEP_PCT)[1] if v is not None]
    threads = [v for v in reader.sampled(names.THREADS_PCT)[1] if v is not None]
    if not shares and not threads:
        return None

    def median(values: list) -> float | None:
        return statistics.median(values) if values else None

    def whole(name: str) -> int | None:
        value = latest.get(name)
        return None if value is None else int(value)

    return {"step_pct": median(shares), "threads_pct": median(threads), "readings": len(shares),
            "budget_pct": latest.get(names.BUDGET_PCT), "layers_every": whole(names.LAYERS_EVERY),
            "doctor_every": whole(names.DOCTOR_EVERY)}


def _point(point) -> dict | None:
    return None if point is None else {"step": point.step, "value": point.value}


def _checkpoints(run_dir: Path) -> dict:
    """Where the checkpoints are: the folder, how many, and the newest by step."""
    folder = run_dir / "checkpoints"
    found = sorted((int(m.group(1)), p.name) for p in folder.glob("*.pt") if (m := _CHECKPOINT.match(p.name)))
    others = [p.name for p in folder.glob("*.pt") if not _CHECKPOINT.match(p.name)]
    return {"dir": str(folder) if folder.is_dir() else None, "count": len(found) + len(others),
            "newest": found[-1][1] if found else (sorted(others)[-1] if others else None)}


def render(s: dict) -> str:
    """The summary as plain text, one figure a line."""
    how = s["state"] + (f", {s['exit']}" if s["exit"] and s["state"] in ENDED else "")
    lines = [f"{s['name']}  ({how})", _row("run dir", s["run_dir"])]
    if s.get("parent"):
        lines.append(_row("forked from", f"{s['parent']['run_dir']} at step {s['parent']['step']:,}"))
    steps = "no step yet" if s["step"] is None else f"{s['step']:,}"
    if s["step"] is not None and s["total_steps"]:
        steps += f" of {s['total_steps']:,}"
    lines.append(_row("steps", steps))
    timing = fmt_duration(s["duration_s"]) if s["duration_s"] is not None else "unknown"
    if s["steps_per_s"] is not None:
        timing += f", {fmt_si(s['steps_per_s'])} steps/s"
    lines.append(_row("duration", timing))
    if s[names.LOSS]:
        lines.append(_row("loss", "  ".join(f"{k} {_at(s[names.LOSS][k])}" for k in ("first", "last", "best"))))
    if s["lr"]:
        lines.append(_row("last lr", f"{fmt_si(s['lr']['value'])} ({s['lr']['name']}, step {s['lr']['step']:,})"))
    if s["grad_norm"]:
        g = s["grad_norm"]
        lines.append(_row("grad norm", f"min {_at(g['min'])}  max {_at(g['max'])}  last {_at(g['last'])}"))
    width = max((len(p["name"]) for p in s["printed"][:PRINTED_SHOWN]), default=0)
    for i, p in enumerate(s["printed"][:PRINTED_SHOWN]):
        lines.append(_row("printed" if i == 0 else "", f"{p['name']:<{width}}  last {_at(p['last'])}  "
                          f"min {_at(p['min'])}  max {_at(p['max'])}"))
    if len(s["printed"]) > PRINTED_SHOWN:
        lines.append(_row("", f"and {len(s['printed']) - PRINTED_SHOWN} more printed metrics (--json has them all)"))
    if s["changes"]:
        said = [f"step {c['step']}: {c['name'].replace('_', '-')} "
                f"{'off' if c['value'] is None else fmt_si(c['value'], 4)}" for c in s["changes"]]
        lines.append(_row("changes", "; ".join(said)))
    else:
        lines.append(_row("changes", "none (no clip or LR factor command)"))
    rows = s.get("anomalies") or []
    lines.append(_row("anomalies", f"{len(rows)}" if rows else "none"))
    lines += [_row("", line) for line in listing_of(rows)]
    found = s["findings"]
    lines.append(_row("findings", f"{len(found)}: " + ", ".join(f"{f['id']} ({f['severity']})" for f in found)
                      + f"  (ptdash doctor {s['run_dir']})" if found else "none"))
    stalls = [f for f in found if f["id"] == "stalled" and f.get("seconds") is not None]
    if stalls:  # each stall's whole length (or so far, or until the run ended during it)
        lines.append(_row("stalls", "; ".join(
            f"step {f['step']:,}: {fmt_duration(f['seconds'])}" + ("" if f["over"] else " so far")
            + (" (the run ended while stalled)" if f["with_run"] else "") for f in stalls)))
    if s.get("cost"):
        c = s["cost"]
        said = cost_line(c["step_pct"], c["threads_pct"], c["budget_pct"])
        sampled = sampling_line(c["layers_every"], c["doctor_every"])
        lines.append(_row("cost", f"{said} (median over the run)" + (f"; {sampled} at the end" if sampled else "")))
    kept = kept_line(s.get("kept"))
    if kept:
        lines.append(_row("kept", kept.removeprefix("kept: ")))
    ck = s["checkpoints"]
    lines.append(_row("checkpoints", f"{ck['count']} in {ck['dir']}, newest {ck['newest']}" if ck["count"]
                      else "none"))
    if s["damage"]:
        lines.append(_row("damage", s["damage"]))
    elif s.get("integrity"):
        lines.append(_row("store", s["integrity"]))
    return "\n".join(lines)


def listing_of(rows: list[dict]) -> list[str]:
    """The plain lines of ``summarize``'s anomalies (incidents.listing of its JSON rows)."""
    return listing([Incident(r["step"], r["what"], r["action"], r["kind"], ranks=list(r["ranks"])) for r in rows])


def _row(label: str, text: str) -> str:
    return f"  {label:<12}{text}"


def _at(point: dict | None) -> str:
    if point is None:
        return "N/A"
    return f"{fmt_si(point['value'], 4)} (step {point['step']:,})"


def print_summaries(runs: list[RunSummary], as_json: bool) -> int:
    """Print the summaries of ``runs`` (one JSON object, or an array for several); exit status 0,
    1 when a run's history is damaged (as ``export`` says of it)."""
    found = [summarize(r) for r in runs]
    if as_json:
        print(json.dumps(found[0] if len(found) == 1 else found, indent=2))
    else:
        print("\n\n".join(render(s) for s in found))
    return 1 if any(s["damage"] for s in found) else 0
