"""``ptdash ls``: the runs here and the live ones anywhere (``--all``: every run), as a table or JSON."""

from __future__ import annotations

import argparse
import json
import socket
from pathlib import Path

from . import runs


def cmd_ls(args: argparse.Namespace) -> int:
    """One line per run, oldest first, filtered by ``--state`` and ``--name``; exit status 0."""
    found = runs.all_runs(everywhere=args.all)
    if args.state:
        found = [r for r in found if r.state in args.state]
    if args.name:
        found = [r for r in found if args.name in r.info.name or args.name in r.path.name]
    if args.json:
        print(json.dumps([_as_json(r) for r in found], indent=2))
        return 0
    if not found:
        where = "anywhere (the list of every run)" if args.all else "here (looked in ./ptdash-runs and the live-run registry)"
        print(f"no runs {where}" + (" matching the filters" if args.state or args.name else ""))
        return 0
    print(f"{'RUN':<40} {'STATE':<9} {'STEP':>9} {'AGE':>5}  WHERE")
    for r in found:
        step = "" if r.step is None else f"{r.step:,}"
        host = r.info.host
        where = f"{r.path}" + (f" (on {host})" if host and host != socket.gethostname() else "")
        if r.info.parent:
            where += f" (fork of {Path(r.info.parent).name} at step {r.info.fork_step})"
        print(f"{r.path.name[:40]:<40} {r.state:<9} {step:>9} {runs.age(r.started):>5}  {where}")
    return 0


def _as_json(r: runs.RunSummary) -> dict:
    info = r.info
    return {"name": info.name, "id": info.id, "run_dir": str(r.path), "state": r.state, "status": info.status,
            "step": r.step, "total_steps": info.total_steps, "started": r.started or None, "ended": info.ended,
            "exit_code": info.exit_code, "host": info.host, "argv": info.argv, "cwd": info.cwd,
            "parent": info.parent, "fork_step": info.fork_step}
