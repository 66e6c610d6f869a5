"""The key that proves a node belongs to the job: from the job's environment, or a per-user
file on the shared home. Stdlib only.

``PTDASH_LINK_KEY`` (at least 32 hex digits), when set, is the key: a scheduler hands the
job's environment to every node, and only the job's owner can read a process's
environment. Otherwise the key is ``$XDG_CONFIG_HOME/ptdash/link.key`` (``~/.config/...``):
64 hex digits in a regular file of this user's, mode 0600, in a directory others cannot
write. The first node to need it creates it (atomically: two nodes starting together on
a shared home end up with the same key). The key never goes through the job's TCP store.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

ENV = "PTDASH_LINK_KEY"
MIN_HEX = 32
"""Hex digits a key must have at least (128 bits)."""


class LinkKeyError(ValueError):
    """The key cannot be had safely; the message says why and what to do."""


def key_path() -> Path:
    """Where the per-user key file lives."""
    config = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(config) / "ptdash" / "link.key"


def _parse(text: str, where: str) -> bytes:
    text = text.strip()
    try:
        key = bytes.fromhex(text)
    except ValueError:
        raise LinkKeyError(f"{where} is not hexadecimal") from None
    if len(text) < MIN_HEX:
        raise LinkKeyError(f"{where} has {len(text)} hex digits; it needs at least {MIN_HEX}")
    return key


def _check_file(path: Path) -> None:
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        raise LinkKeyError(f"{path} is not a regular file; refusing to use it as the link key")
    if st.st_uid != os.getuid():
        raise LinkKeyError(f"{path} belongs to uid {st.st_uid}, not you; refusing to use it as the link key")
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise LinkKeyError(f"{path} has mode {stat.S_IMODE(st.st_mode):o}; others may read it: "
                        f"chmod 600 {path} (and make sure nobody else holds a copy)")
    parent = os.lstat(path.parent)
    if parent.st_uid != os.getuid() or stat.S_IMODE(parent.st_mode) & 0o022:
        raise LinkKeyError(f"{path.parent} can be written by others; refusing a link key there")


def load_key(create: bool = True) -> bytes:
    """The job's key: the environment's, else the key file's (made when ``create`` and missing).
    Raises LinkKeyError with a one-line reason."""
    if os.environ.get(ENV):
        return _parse(os.environ[ENV], ENV)
    path = key_path()
    if not path.exists() and create:
        _create(path)
    try:
        _check_file(path)
        return _parse(path.read_text(), str(path))
    except FileNotFoundError:
        raise LinkKeyError(f"no link key: {path} does not exist (set {ENV} in the job's environment, "
                        f"or run node 0 first on a home every node shares)") from None
    except OSError as exc:
        raise LinkKeyError(f"cannot read the link key {path}: {exc.strerror or exc}") from None


def _create(path: Path) -> None:
    """A new key file, published with link(2): it appears whole or not at all, and never
    replaces another node's."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another node made it first: theirs is the key
    finally:
        os.unlink(tmp)
