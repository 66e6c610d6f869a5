"""Only the run's owner: the per-user private directory for sockets and the live-run
registry, and who is at the other end of a socket.

The directory is ``$XDG_RUNTIME_DIR/ptdash`` (per user, on tmpfs) or
``/tmp/ptdash-<uid>``, created 0700 and refused if another user owns it, others can
enter it, it is a symlink, or it sits on a network file system. An XDG_RUNTIME_DIR that
another user owns or may rename entries in (writable by others, no sticky bit) is
passed over for ``/tmp``, saying so. Stdlib only.
"""

from __future__ import annotations

import logging
import os
import socket
import stat
import struct
import sys
import tempfile
from pathlib import Path

from .protocol import TransportError

log = logging.getLogger("ptdash.shared.private")

_NETWORK_FILESYSTEMS = {"nfs", "nfs4", "cifs", "smb3", "smbfs", "fuse.sshfs", "afs", "9p", "lustre", "gpfs"}


def private_dir() -> Path:
    """The per-user directory for sockets and the live-run registry, created 0700.

    ``$XDG_RUNTIME_DIR/ptdash`` when that exists and is safe (``unsafe_parent``), else
    ``/tmp/ptdash-<uid>``, saying once why XDG_RUNTIME_DIR was passed over. Refuses a
    directory that another user owns, that others can enter, or that sits on a network
    file system.
    """
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    path = None
    if runtime and os.path.isdir(runtime):
        why = unsafe_parent(Path(runtime))
        if why is None:
            path = Path(runtime) / "ptdash"
        else:
            fallback = Path(tempfile.gettempdir()) / f"ptdash-{os.getuid()}"
            _say_once(f"ptdash: XDG_RUNTIME_DIR {runtime} is not used: {why}; the control socket goes in "
                      f"{fallback} instead")
    if path is None:
        path = Path(tempfile.gettempdir()) / f"ptdash-{os.getuid()}"
        why = unsafe_parent(path.parent)
        if why is not None:
            raise TransportError(f"cannot make a private directory in {path.parent}: {why}")
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise TransportError(f"cannot create the private directory {path}: {exc.strerror or exc}") from None
    check_private_dir(path)
    return path


def unsafe_parent(directory: Path) -> str | None:
    """Why ``directory`` cannot hold the private directory, or None.

    Whoever may rename entries of a directory on the way to ours can swap our directory
    for theirs, listen on a run's socket path and collect the token a client sends. So
    ``directory`` and each directory above it must belong to this user or root, and any
    that others may write to must have the sticky bit (as /tmp has).
    """
    try:
        current = Path(os.path.abspath(directory))
        while True:
            st = os.stat(current)
            if st.st_uid not in (os.getuid(), 0):
                return f"{current} belongs to uid {st.st_uid}, not you"
            if stat.S_IMODE(st.st_mode) & 0o022 and not st.st_mode & stat.S_ISVTX:
                return f"others may write to {current} (mode {stat.S_IMODE(st.st_mode):o}, no sticky bit)"
            if current.parent == current:
                return None
            current = current.parent
    except OSError as exc:
        return f"cannot check {directory}: {exc.strerror or exc}"


_said: set[str] = set()


def _say_once(note: str) -> None:
    """A note for the user, once per process: on stderr, or in the log where one is kept
    (the engine's engine.log; its stderr is the script's output.log)."""
    if note in _said:
        return
    _said.add(note)
    if log.hasHandlers():
        log.warning("%s", note)
    else:
        print(note, file=sys.stderr, flush=True)


def check_private_dir(path: Path) -> None:
    """Raise TransportError unless ``path`` is a real directory, ours, mode 0700, local."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise TransportError(f"cannot use {path}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise TransportError(f"{path} is not a directory; refusing to put the control socket there")
    if st.st_uid != os.getuid():
        raise TransportError(f"{path} belongs to uid {st.st_uid}, not you; refusing to use it")
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise TransportError(f"{path} has mode {stat.S_IMODE(st.st_mode):o}; it must be 700")
    fstype = filesystem_type(path)
    if fstype in _NETWORK_FILESYSTEMS:
        raise TransportError(f"{path} is on a network file system ({fstype}); set XDG_RUNTIME_DIR to a local one")


def filesystem_type(path: Path, mounts: str | None = None) -> str | None:
    """The type of the file system holding ``path``, from /proc/mounts (None if unknown).

    ``mounts`` is that table's text, read from /proc when not given.
    """
    if mounts is None:
        try:
            mounts = Path("/proc/mounts").read_text()
        except OSError:
            return None
    target, best = str(Path(path).resolve()), (-1, None)
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        mount = fields[1].replace("\\040", " ")
        if (target == mount or target.startswith(mount.rstrip("/") + "/")) and len(mount) > best[0]:
            best = (len(mount), fields[2])
    return best[1]


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a connected Unix socket."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return uid


