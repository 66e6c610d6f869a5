"""Who may read a run: its directory is 0700 and every file in it 0600 by default; a run
shared with a group (``ptdash --share-group GROUP``) is 2750 and 0640, owned by that group.

The run dir's own mode is the policy: whoever writes into it (the CLI, the engine, the
store, checkpoints, profiles, exports) opens the file through ``open_file`` or fixes a
file a library wrote with ``secure``, and gets the mode that ``file_mode`` reads off the
directory. So a private run stays private and a shared one stays shared, whatever the
process's umask; the umask itself is left alone, because the script's own files are the
script's business. The setgid bit of a shared dir gives new files and subdirectories its
group. The token is 0600 either way: a group may read a run, never steer it.

Stdlib only.
"""

from __future__ import annotations

import grp
import os
import stat
from pathlib import Path

PRIVATE_DIR, PRIVATE_FILE = 0o700, 0o600
SHARED_DIR, SHARED_FILE = 0o2750, 0o640


def group_id(name: str) -> int:
    """The id of group ``name`` (or a number), checked to be one of this user's groups.

    Raises ValueError with a one-line message.
    """
    try:
        gid = int(name) if name.isdigit() else grp.getgrnam(name).gr_gid
    except KeyError:
        raise ValueError(f"no group named {name!r}") from None
    if os.getuid() != 0 and gid not in (os.getgid(), *os.getgroups()):
        raise ValueError(f"you are not in group {name!r}, so a run cannot be shared with it")
    return gid


def make_run_dir(path: Path, group: int | None = None, exist_ok: bool = False) -> None:
    """Create the run dir ``path`` private, or shared with ``group``: 0700 or 2750."""
    path.mkdir(mode=PRIVATE_DIR, exist_ok=exist_ok)
    if group is not None:
        os.chown(path, -1, group)
    os.chmod(path, PRIVATE_DIR if group is None else SHARED_DIR)  # whatever the umask took away


def shared(directory: Path) -> bool:
    """Whether ``directory`` (a run dir or one inside it) lets its group in."""
    return bool(os.stat(directory).st_mode & stat.S_IRGRP)


def file_mode(directory: Path) -> int:
    """The mode of a new file in ``directory``: 0600, or 0640 in a shared run."""
    return SHARED_FILE if shared(directory) else PRIVATE_FILE


def make_dir(path: Path) -> Path:
    """Create ``path`` (and missing parents) inside a run dir, with the run dir's mode."""
    missing = []
    parent = path
    while not parent.exists():
        missing.append(parent)
        parent = parent.parent
    mode = SHARED_DIR if shared(parent) else PRIVATE_DIR
    for directory in reversed(missing):
        directory.mkdir(mode=PRIVATE_DIR, exist_ok=True)
        os.chmod(directory, mode)
    return path


def open_file(path: Path, flags: int = os.O_WRONLY | os.O_CREAT | os.O_TRUNC) -> int:
    """``os.open`` of a file inside a run dir, created (or left) with the run's file mode.

    Returns the descriptor; wrap it with ``os.fdopen``.
    """
    path = Path(path)
    mode = file_mode(path.parent)
    fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0), mode)
    try:
        os.fchmod(fd, mode)  # the umask may have taken the group's bit, or it existed wider
    except BaseException:
        os.close(fd)
        raise
    return fd


def touch(path: Path) -> None:
    """Create ``path`` empty (if missing) with the run's file mode, for a library to open after."""
    os.close(open_file(path, os.O_WRONLY | os.O_CREAT))


def secure(path: Path) -> None:
    """Give a file a library wrote inside a run dir (a profiler trace) the run's file mode."""
    os.chmod(path, file_mode(Path(path).parent))
