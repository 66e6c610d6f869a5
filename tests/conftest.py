"""Shared fixtures of every tier.

The tiers: ``unit/`` (pure, in process, seconds), ``integration/`` (real subprocesses,
sockets and the real CLI), ``tui/`` (Pilot and snapshot tests of the dashboard against
recorded runs), ``e2e/`` (a real terminal through tmux). ``support/`` holds the helpers
they share; it is importable because pyproject.toml puts ``tests/`` on the path.
"""

from __future__ import annotations

import os
import tempfile

import pytest

from support.recorded_run import FakeEngine, make_run


def pytest_configure(config):
    """Every run a test creates (in process or through the CLI) is recorded for ``ls --all``
    in a temporary state dir, never in the user's own list. Set before any test module is
    imported, so the subprocess environment they copy has it too."""
    os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="ptd-state-")


@pytest.fixture
def recorded_run(tmp_path):
    """A finished demo-like run of 500 steps, recorded the way the engine writes one."""
    return make_run(tmp_path, steps=500, status="finished", exit_code=0)


@pytest.fixture
def live_run(tmp_path):
    """A running demo-like run at step 500, served on its real socket by a FakeEngine."""
    run_dir = make_run(tmp_path, steps=500, status="running")
    with FakeEngine(run_dir, step=500) as engine:
        yield run_dir, engine
