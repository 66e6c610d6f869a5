"""The notifier's loop: follow a run's run.json and events, tell what needs a person.

``python -m ptdash.tui.notify RUN_DIR --command CMD [--on KINDS]``; ``ptdash`` starts it
(``start``) with the engine when given ``--notify``. It polls once a second (a reader of
the store, never a writer but for the one failure note), and ends with the run: once
run.json says the run ended, or once the process the CLI started is gone and nobody wrote
the end for it (then it says the run was killed).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from ptdash.shared import rundir
from ptdash.shared.config import RunInfo
from ptdash.shared.protocol import ENDED
from ptdash.shared.reader import StoreReader, wait_for_store
from ptdash.shared.store import STORE_NAME, StoreError

from . import KINDS
from .command import Notifier
from .limiter import RateLimiter
from .notices import Notice, of_end, of_event, of_lost, payload

POLL_S = 1.0
"""Seconds between two reads of the run."""
LOST_GRACE_S = 10.0
"""After the engine's process is gone, how long the front that started it has to write its end."""


class Watch:
    """One run followed: its new events to notices, the limiter, the calls."""

    def __init__(self, *, run_dir: Path, notifier: Notifier, kinds: frozenset[str], limiter: RateLimiter) -> None:
        self.run_dir, self.notifier, self.kinds, self.limiter = run_dir, notifier, kinds, limiter
        self.reader: StoreReader | None = None
        self.after_id = 0
        self.gone_since: float | None = None

    def step(self, now: float) -> bool:
        """Read what is new and make the calls due; False once the run has ended (told)."""
        try:
            info = rundir.read_info(self.run_dir)
        except (OSError, ValueError):
            return True
        for notice in self._new_notices():
            if notice.kind in self.kinds:
                call = self.limiter.offer(notice, now)
                if call is not None:
                    self._call(call.notice, info)
        for call in self.limiter.due(now):
            self._call(call.notice, info, call.count, call.earlier)
        if info.status in ENDED:
            self._new_notices()  # none of the run's last events is left out of the end's call
            self._end(of_end(info), info)
            return False
        if _alive(info):
            self.gone_since = None
        elif self.gone_since is None:
            self.gone_since = now
        elif now - self.gone_since >= LOST_GRACE_S:
            self._end(of_lost(info), info)
            return False
        return True

    def _new_notices(self) -> list[Notice]:
        self.reader = self.reader or wait_for_store(self.run_dir / STORE_NAME, 0)
        if self.reader is None:
            return []
        try:
            found = self.reader.events(after_id=self.after_id)
        except StoreError:
            return []
        out = []
        for event in found:
            self.after_id = max(self.after_id, event.id or 0)
            notice = of_event(event)
            if notice is not None:
                out.append(notice)
        return out

    def _end(self, notice: Notice, info: RunInfo) -> None:
        held = {kind: summed for kind, summed in self.limiter.held_summary().items()}
        if "end" in self.kinds:
            self.notifier.call("end", payload(notice, info, held=held))

    def _call(self, notice: Notice, info: RunInfo, count: int = 1, earlier: list[Notice] = ()) -> None:
        self.notifier.call(notice.kind, payload(notice, info, count, list(earlier)))


def _alive(info: RunInfo) -> bool:
    """Whether the process the CLI started (the engine, or the DDP launcher) still runs."""
    pid = info.launcher_pid or info.pid
    return pid is None or rundir.pid_alive(pid)


def parse_kinds(text: str) -> frozenset[str]:
    """``--notify-on``: a comma-separated list of KINDS (or ``all``); ValueError names a bad one."""
    kinds = {k.strip() for k in text.split(",") if k.strip()}
    if kinds == {"all"}:
        return frozenset(KINDS)
    bad = sorted(kinds - set(KINDS))
    if bad or not kinds:
        raise ValueError(f"--notify-on takes kinds from {', '.join(KINDS)} (comma-separated), got {text[:40]!r}")
    return frozenset(kinds)


def start(run_dir: Path, command: str, kinds: frozenset[str]) -> subprocess.Popen:
    """Start the notifier of ``run_dir`` in a session of its own (a closed terminal or a
    Ctrl-C does not end it; the run's end does)."""
    return subprocess.Popen([sys.executable, "-m", "ptdash.tui.notify", str(run_dir.resolve()), "--command", command,
                             "--on", ",".join(sorted(kinds))], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def main(argv: list[str] | None = None) -> int:
    """The notifier process: follow the run until it ends."""
    p = argparse.ArgumentParser(prog="python -m ptdash.tui.notify")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--command", required=True)
    p.add_argument("--on", default="all")
    args = p.parse_args(argv)
    watch = Watch(run_dir=args.run_dir, notifier=Notifier(command=args.command, run_dir=args.run_dir),
                  kinds=parse_kinds(args.on), limiter=RateLimiter())
    while watch.step(time.monotonic()):
        time.sleep(POLL_S)
    return 0
