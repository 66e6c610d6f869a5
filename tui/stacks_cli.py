"""``ptdash stacks [RUN] [--json]`` (and ``ptdash ctl [RUN] stacks``): where every rank is now.

Asks the live run's engine for every rank's stacks (a ``stacks`` command on the control
socket; each rank's engine takes its own from a thread of its own while the training runs on)
and prints them side by side: one sentence naming where each rank is, the training
thread's frames common to every rank folded, the frame where ranks differ marked ▶, then
each rank's other threads. A rank that did not answer is named with its last step and its
process's state from /proc; so is the run's engine itself when it does not answer in time
(C code holding its GIL). Exit status: 0 with every rank's stacks, 1 when some rank (or the
engine) did not answer, 2 on bad usage or an ambiguous run.
"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

from ptdash.shared import rundir
from ptdash.shared.protocol import Command, Stacks, TransportError
from ptdash.shared.stacks import RankStacks, process_state, read, render, summary

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
