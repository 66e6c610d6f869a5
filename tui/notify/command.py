"""Running the user's ``--notify`` command: ``Notifier``.

The command is run by ``sh -c`` (so ``curl ... -d @-`` and ``mail -s ... you@lab``
read as they would typed), with the call's JSON object on its stdin and ``PTDASH_EVENT``
(the kind) and ``PTDASH_RUN`` (the run dir, which ``ptdash show`` takes) in its
environment. A command that fails (exits non-zero, cannot start, runs past
``TIMEOUT_S``) is journaled once a run, in the run's events; later failures only count.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import time
from pathlib import Path

from ptdash.shared.protocol import Event
from ptdash.shared.store import STORE_NAME, append_event

TIMEOUT_S = 60.0
"""How long one call may run before it is killed and counted as failed."""


class Notifier:
    """Runs ``command`` for each call; says once, in the run's events, that it fails."""

    def __init__(self, *, command: str, run_dir: Path, timeout_s: float = TIMEOUT_S) -> None:
        self.command, self.run_dir, self.timeout_s = command, run_dir, timeout_s
        self.calls = 0
        self.failures = 0

    def call(self, kind: str, body: dict) -> bool:
        """Run the command once for ``body`` (a notice's payload); whether it succeeded."""
        self.calls += 1
        env = dict(os.environ, PTDASH_EVENT=kind, PTDASH_RUN=str(self.run_dir),
                   PTDASH_RUN_NAME=str(body.get("run", "")))
        data = (json.dumps(body, separators=(",", ":"), default=str) + "\n").encode()
        try:
            done = subprocess.run(["/bin/sh", "-c", self.command], input=data, env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, timeout=self.timeout_s, start_new_session=True)
        except subprocess.TimeoutExpired:
            return self._failed(kind, body, f"ran past {self.timeout_s:g} s and was killed", "")
        except OSError as exc:
            return self._failed(kind, body, f"could not start: {exc.strerror or exc}", "")
        if done.returncode != 0:
            return self._failed(kind, body, f"exited with {done.returncode}", done.stderr.decode("utf-8", "replace"))
        return True

    def _failed(self, kind: str, body: dict, how: str, stderr: str) -> bool:
        self.failures += 1
        if self.failures > 1:
            return False
        last = stderr.strip().splitlines()[-1][:200] if stderr.strip() else ""
        message = f"the --notify command {how} (for a {kind} event){': ' + last if last else ''}; " \
                  "later failures are not journaled"
        try:
            note = Event(kind="warning", step=int(body.get("step") or 0), wall=time.time(), message=message,
                         data={"notify": how})
            append_event(self.run_dir / STORE_NAME, note)
        except sqlite3.Error:
            pass  # no store to journal into (a run that never started): the failure is only counted
        return False
