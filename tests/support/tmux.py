"""A real terminal for end-to-end tests: a private tmux server, send-keys, capture-pane."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time

import pytest


def require_tmux() -> None:
    if shutil.which("tmux") is None:
        if os.environ.get("CI"):
            pytest.fail("tmux is required in CI (.ci/run installs it)")
        pytest.skip("tmux is not installed (apt-get install tmux)")


class Terminal:
    """One tmux server of our own (-L), so tests never touch the user's sessions."""

    def __init__(self, name: str) -> None:
        self.server = f"ptdash-test-{os.getpid()}-{name}"

    def tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.server, *args], capture_output=True, text=True,
                              stdin=subprocess.DEVNULL).stdout

    def start(self, session: str, command: str, cwd, width: int = 100, height: int = 30, env: dict | None = None):
        exports = " ".join(f"{k}={v}" for k, v in (env or {}).items())
        # `; sleep` keeps the pane readable after the command exits.
        self.tmux("new-session", "-d", "-s", session, "-x", str(width), "-y", str(height), "-c", str(cwd),
                  f"env {exports} {command}; echo EXITED $?; sleep 600")

    def keys(self, session: str, *keys: str) -> None:
        self.tmux("send-keys", "-t", session, *keys)

    def type(self, session: str, text: str) -> None:
        """Type ``text`` literally (``-l``: no key names, and ``-1`` is not an option)."""
        self.tmux("send-keys", "-t", session, "-l", "--", text)

    def screen(self, session: str) -> str:
        return self.tmux("capture-pane", "-p", "-t", session)

    def wait_for(self, session: str, text: str | re.Pattern, timeout: float = 60) -> str:
        """The screen once ``text`` (a string, or a compiled pattern searched for) is on it."""
        seen = text.search if isinstance(text, re.Pattern) else (lambda screen: text in screen)
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = self.screen(session)
            if seen(screen):
                return screen
            time.sleep(0.2)
        raise AssertionError(f"{getattr(text, 'pattern', text)!r} never appeared on screen:\n{screen}")

    def kill_session(self, session: str) -> None:
        self.tmux("kill-session", "-t", session)

    def close(self) -> None:
        self.tmux("kill-server")
