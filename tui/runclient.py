"""A client of a run's engine for the commands that ask it one thing (``ctl``, ``stacks``):
the run's token read (or why not, in one line), a command sent and its answer awaited."""

from __future__ import annotations

import time
from pathlib import Path

from ptdash.shared import rundir
from ptdash.shared.client import Client
from ptdash.shared.protocol import ENDED, Command, Status, TransportError


def run_label(path: Path) -> str:
    """How a reply names its run: the run dir, relative to here when it is under here."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def run_client(run_dir: Path, why: str) -> tuple[rundir.RunInfo, Client]:
    """The run's info and a client of its engine, not connected yet; a token this user cannot
    read is said in one line (``why``: what only the owner may do)."""
    info = rundir.read_info(run_dir)
    try:
        token = rundir.read_token(run_dir)
    except PermissionError:
        raise TransportError(f"cannot read {Path(run_dir) / 'token'}: permission denied "
                             f"(only the run's owner can {why})") from None
    return info, Client(info.socket, token, name="ctl")


def answer(client: Client, cmd: Command, kind: type, timeout: float):
    """Send ``cmd`` and wait (at most ``timeout`` s) for the engine's message of ``kind`` with
    its id; None on timeout. A run that ends first is a TransportError."""
    client.send(cmd)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = client.recv(timeout=max(0.0, deadline - time.monotonic()))
        if isinstance(msg, kind) and msg.id == cmd.id:
            return msg
        if isinstance(msg, Status) and msg.state in ENDED:
            raise TransportError(f"the run ended ({msg.state}) before answering")
    return None
