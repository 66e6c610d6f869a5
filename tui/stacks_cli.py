"""``ptdash stacks [RUN] [--json]`` (and ``ptdash ctl [RUN] stacks``): where every rank is now.

Asks the live run's engine for every rank's stacks (a ``stacks`` command on the control
socket; each rank's engine takes its own from a thread of its own while the training runs on)
and prints them side by side: one sentence naming where each rank is, the training
thread's frames common to every rank folded, the frame where ranks differ marked ▶, then
each rank's other threads. A rank that did not answer is named with its last step and its
process's state from /proc; so is the run's engine itself when it does not answer in time
(C code holding its GIL). A run that cannot be asked (it ended, or its engine is gone) gets
the stacks its newest stall kept, said as such. Exit status: 0 with every rank's stacks of
now, 1 when some rank (or the engine) did not answer or the run cannot be asked, 2 on bad
usage or an ambiguous run.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import uuid
from pathlib import Path

from ptdash.shared import events, rundir
from ptdash.shared.protocol import Command, Stacks, TransportError
from ptdash.shared.reader import StoreReader
from ptdash.shared.stacks import RankStacks, process_state, read, render, summary
from ptdash.shared.store import STORE_NAME, StoreError

from . import runs, subcommands
from .errors import CliError
from .runclient import answer, run_client, run_label

ENGINE_SECONDS = 10.0
"""How long ``ptdash stacks`` waits for the engine's answer."""


def cmd_stacks(argv: list[str], run_spec: str | None = None, as_json: bool | None = None) -> int:
    """Print every rank's stacks of a live run; see the module docstring for the exit status."""
    if argv is not None:
        args = subcommands.parse("stacks", argv)
        run_spec, as_json, wait = args.run, args.json, args.timeout
    else:
        wait = ENGINE_SECONDS
    run = runs.resolve(run_spec, live_only=True)
    if not run.live:
        return _kept(run, as_json)
    try:
        ranks = take_stacks(run.path, wait)
    except TransportError as exc:
        raise CliError(str(exc), 1) from None
    if ranks is None:
        info = rundir.read_info(run.path)
        state, wchan = process_state(info.pid) if info.pid else ("", "")
        ranks = [RankStacks(rank=0, pid=info.pid or 0, step=run.step, answered=False, state=state, wchan=wchan,
                            note=f"the run's engine did not answer in {wait:g} s: its interpreter is busy "
                                 "(C code holding the GIL?)").to_data()]
    found = read(ranks)
    if as_json:
        print(json.dumps({"run_dir": str(run.path), "summary": summary(found), "ranks": ranks}))
    else:
        width = shutil.get_terminal_size((120, 24)).columns
        print(f"{run_label(run.path)}: stacks of {len(found)} rank{'s' if len(found) != 1 else ''}")
        print("\n".join(render(found, width=width)))
    return 0 if all(r.answered for r in found) else 1


def kept_stall(run_dir: Path) -> events.Stall | None:
    """The newest stall of a run that kept every rank's stacks, or None."""
    try:
        with StoreReader(run_dir / STORE_NAME) as reader:
            stalls = [s for e in reader.events(kind="stall") if isinstance(s := events.read(e), events.Stall)]
    except (StoreError, OSError, sqlite3.Error):
        return None
    kept = [s for s in stalls if s.stacks and not s.ended]
    return kept[-1] if kept else None


def _kept(run: runs.RunSummary, as_json: bool) -> int:
    """A run that cannot be asked (it ended, or its engine is gone): the stacks its newest
    stall kept, said as such; exit status 1 (none are of now)."""
    ended = f"{run.state} at step {run.step}" if run.step is not None else run.state
    stall = kept_stall(run.path)
    if stall is None:
        raise CliError(f"{run_label(run.path)} is {ended}: its stacks cannot be asked, and no stall kept any", 1)
    ranks = [r.to_data() for r in stall.stacks]
    if as_json:
        print(json.dumps({"run_dir": str(run.path), "live": False, "state": run.state,
                          "kept": {"stall_step": stall.step, "started": stall.started},
                          "summary": stall.where or summary(list(stall.stacks)), "ranks": ranks}))
        return 1
    width = shutil.get_terminal_size((120, 24)).columns
    print(f"{run_label(run.path)} is {ended}: its stacks cannot be asked; these are the ones its stall at "
          f"step {stall.step} kept")
    print("\n".join(render(list(stall.stacks), width=width)))
    return 1


def take_stacks(run_dir: Path, timeout: float = ENGINE_SECONDS) -> list[dict] | None:
    """Every rank's stacks (``RankStacks`` JSON objects), or None when the engine did not answer."""
    info, client = run_client(run_dir, "ask it")
    try:
        client.connect(timeout=timeout)
    except TransportError:
        if rundir.engine_alive(info):
            return None  # alive, and not even its socket's thread answers: its GIL is held
        raise
    try:
        msg = answer(client, Command(id=uuid.uuid4().hex[:8], name="stacks"), Stacks, timeout)
        return None if msg is None else list(msg.ranks)
    finally:
        client.close()
