"""Other local users for the tests of who may reach a run: throwaway accounts and groups
made with useradd/groupadd (root only; a reason to skip otherwise), and a way for such a
user to run this checkout's ``ptdash`` with the system's python, since the venv's
interpreter may live where only root can go."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from contextlib import contextmanager
from pathlib import Path

from support.runner import REPO

SYSTEM_PYTHON = "/usr/bin:/bin"


def skip_reason() -> str | None:
    """Why other users cannot be made here, or None."""
    if os.getuid() != 0:
        return "creating another user needs root"
    for tool in ("useradd", "userdel", "groupadd", "groupdel", "runuser"):
        if not shutil.which(tool):
            return f"{tool} is missing"
    if shutil.which("python3", path=SYSTEM_PYTHON) is None:
        return "no system python3 another user can run"
    return None


def system_python() -> str:
    return shutil.which("python3", path=SYSTEM_PYTHON)


@contextmanager
def throwaway_user(groups: tuple[str, ...] = ()):
    """A system account (in ``groups``), removed afterwards; yields its name.

    Raises RuntimeError with useradd's reason when it cannot be made.
    """
    name = f"ptd-{uuid.uuid4().hex[:8]}"
    made = subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                           *(["-G", ",".join(groups)] if groups else []), name], capture_output=True, text=True)
    if made.returncode != 0:
        raise RuntimeError(f"useradd failed: {made.stderr.strip()}")
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], capture_output=True)


@contextmanager
def throwaway_group():
    """A system group, removed afterwards; yields its name."""
    name = f"ptdg-{uuid.uuid4().hex[:6]}"
    made = subprocess.run(["groupadd", "--system", name], capture_output=True, text=True)
    if made.returncode != 0:
        raise RuntimeError(f"groupadd failed: {made.stderr.strip()}")
    try:
        yield name
    finally:
        subprocess.run(["groupdel", name], capture_output=True)


@contextmanager
def open_base():
    """A directory everyone may enter (0755), for runs whose own modes must do the guarding
    (pytest's tmp_path sits in a 0700 directory, which would keep others out by itself)."""
    base = Path(tempfile.mkdtemp(prefix="ptd-open-"))
    os.chmod(base, 0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


@contextmanager
def ptdash_for_others():
    """A path other users can import this checkout's ``ptdash`` from: ``ptdash`` is
    ``engine/`` with ``tui/`` inside, as the installed package lays them out. Copied, with
    modes everyone may read: the checkout itself may sit where only its owner can go (a
    clean clone in a 0700 temporary directory)."""
    with open_base() as farm:
        package = farm / "ptdash"
        skip = shutil.ignore_patterns("__pycache__")
        shutil.copytree(REPO / "engine", package, ignore=skip)
        shutil.copytree(REPO / "tui", package / "tui", ignore=skip)
        for path in [package, *package.rglob("*")]:
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
        yield farm


def as_user(user: str, *command: str, cwd: str = "/", env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``command`` as ``user`` (no login, a clean environment)."""
    base = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(["runuser", "-u", user, "--", "env", "-i", *(f"{k}={v}" for k, v in {**base, **(env or {})}.items()),
                           *command], capture_output=True, text=True, timeout=120, cwd=cwd)
