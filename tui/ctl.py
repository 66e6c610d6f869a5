"""``ptdash ctl [RUN] COMMAND [VALUE]``: steer a run from another terminal, and ``send_command``.

A command goes over the run's control socket like the dashboard's keys do; the engine
applies it at the next step boundary and answers with an Ack naming the step, which is
printed after the run it went to (with ``--json``, as one JSON object). With no RUN, only
a clear choice is made (see ``runs.resolve``): several live runs are listed, and nothing is
sent. Exit status: 0 when applied, 1 when refused or unanswered, 2 on bad usage or an
ambiguous run.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

from ptdash.shared import rundir
from ptdash.shared.limits import parse_setting
from ptdash.shared.protocol import Ack, Command, TransportError

from . import hardstop, runs, subcommands
from .errors import CliError
from .runclient import answer, run_client, run_label

CTL_COMMANDS = {"pause": "pause", "resume": "resume", "checkpoint": "checkpoint", "clip": "clip",
                "lr-scale": "lr_scale", "stop": "stop", "kill": "kill", "profile": "profile",
                "stacks": "stacks", "rollback": "rollback"}


def cmd_ctl(argv: list[str]) -> int:
    """Send one command to a live run and print its Ack; see the module docstring for the exit status."""
    args = subcommands.parse("ctl", argv)
    usage = "usage: ptdash ctl [RUN] pause|resume|checkpoint|clip X|lr-scale X|profile N|stop|kill|stacks|rollback"
    words = list(args.words)
    spec = None
    if words and words[0] not in CTL_COMMANDS:
        spec = words.pop(0)
    if not words or words[0] not in CTL_COMMANDS:
        raise CliError(usage)
    name = CTL_COMMANDS[words.pop(0)]
    value = None
    if name in ("clip", "lr_scale", "profile"):
        if len(words) != 1:
            raise CliError(f"{name.replace('_', '-')} takes one value ({usage})")
        try:
            value = parse_setting(name, words[0])
        except ValueError as exc:
            raise CliError(str(exc), 1) from None
    elif words:
        raise CliError(f"unexpected {' '.join(words)!r} ({usage})")
    if name == "stacks":
        from .stacks_cli import cmd_stacks

        return cmd_stacks(None, spec, args.json)
    run = runs.resolve(spec, live_only=True)
    cmd = Command(id=uuid.uuid4().hex[:8], name=name, value=value)
    if name == "kill":
        return _kill(run.path, cmd, args.json)
    try:
        ack = send_command(run.path, cmd)
    except TransportError as exc:
        raise CliError(str(exc), 1) from None
    label = run_label(run.path)
    if ack is None:
        raise CliError(f"{label}: no answer from the engine in time (is the step very long?)", 1)
    if args.json:
        print(json.dumps({"run_dir": str(run.path), "command": ack.name, "value": value, "id": ack.id, "ok": ack.ok,
                          "step": ack.step, "message": ack.message}))
    else:
        where = f"at step {ack.step}: " if ack.step is not None else ""
        print(f"{label}: {name}: {where}{ack.message}" if ack.ok else f"{label}: {name} refused: {ack.message}")
    return 0 if ack.ok else 1


def _kill(run_dir: Path, cmd: Command, as_json: bool) -> int:
    """The kill command, made good from here when the engine cannot take it (its Python does
    not run: a C call holding the GIL): the run's processes are killed, what they wrote that
    the engine could not copy kept in output.log (hardstop.py). Never says killed if not."""
    label = run_label(run_dir)
    try:
        send_command(run_dir, cmd, wait=False)
        unanswered = None
    except TransportError as exc:
        unanswered = str(exc)
    info = rundir.read_info(run_dir)
    pid = info.launcher_pid or info.pid
    deadline = time.monotonic() + (0 if unanswered else hardstop.KILL_WAIT_S)
    while pid is not None and hardstop.alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    why = unanswered or f"it did not end within {hardstop.KILL_WAIT_S:g} s"
    killed = hardstop.make_kill_good(run_dir, why, "ptdash ctl kill")
    if killed is None:
        raise CliError(f"{label}: the engine did not take the kill, and process {pid} is not this run's "
                       "(or not on this machine): nothing killed", 1)
    how = f"killed from here (the engine did not take the kill: {why})" if killed else "killed"
    if as_json:
        print(json.dumps({"run_dir": str(run_dir), "command": "kill", "value": None, "id": cmd.id, "ok": True,
                          "step": None, "message": how}))
    else:
        print(f"{label}: {how}")
    return 0


def send_command(run_dir: Path, cmd: Command, wait: bool = True, timeout: float = 120.0) -> Ack | None:
    """Send one command; with ``wait``, return the engine's Ack for it (None on timeout)."""
    _, client = run_client(run_dir, "steer it")
    client.connect()
    try:
        if not wait:
            client.send(cmd)
            return None
        return answer(client, cmd, Ack, timeout)
    finally:
        client.close()
