"""Only the run's owner: the per-user private directory for sockets and the live-run
registry, and who is at the other end of a socket.

The directory is ``$XDG_RUNTIME_DIR/ptdash`` (per user, on tmpfs) or
``/tmp/ptdash-<uid>``, created 0700 and refused if another user owns it, others can
enter it, it is a symlink, or it sits on a network file system. Stdlib only.
"""

from __future__ import annotations

import os
import socket
import stat
import struct
import tempfile
from pathlib import Path

from .protocol import TransportError

_NETWORK_FILESYSTEMS = {"nfs", "nfs4", "cifs", "smb3", "smbfs", "fuse.sshfs", "afs", "9p", "lustre", "gpfs"}


def private_dir() -> Path:
    """The per-user directory for sockets and the live-run registry, created 0700.

    ``$XDG_RUNTIME_DIR/ptdash`` when that exists (per user, on tmpfs), else
    ``/tmp/ptdash-<uid>``. Refuses a directory that another user owns, that others can
    enter, or that sits on a network file system.
    """
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        path = Path(runtime) / "ptdash"
    else:
        path = Path(tempfile.gettempdir()) / f"ptdash-{os.getuid()}"
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise TransportError(f"cannot create the private directory {path}: {exc.strerror or exc}") from None
    check_private_dir(path)
    return path


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


