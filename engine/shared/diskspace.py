"""A full disk, named once and plainly, and the little space kept back for the run's end.

Every part that writes into the run dir (checkpoints, output.log, the store, run.json)
can meet a full filesystem. None of them may end training over it: each keeps going and
says so through ``NOTICE``, which names the full disk once ("no space left on the run
dir's filesystem: 3.1 MB free, checkpoint needs 5.2 MB") until it has room again.

``RESERVE`` is a small file made with the run dir: when run.json cannot be written for
want of space, it is deleted and the write tried again, so a run always ends in a final
state. Stdlib only (the CLI makes the reserve).
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from pathlib import Path
from typing import Callable

from . import perms

log = logging.getLogger("ptdash.diskspace")

RESERVE = ".ptdash-reserve"
RESERVE_BYTES = 1 << 20
"""Space held back for run.json and the store's last writes at the run's end."""

FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def free_bytes(path: Path | str) -> int | None:
    """Bytes this user may still write on ``path``'s filesystem, or None when unknown."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def is_full(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or what caused it) says the disk or the quota is full."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, OSError) and exc.errno in FULL_ERRNOS:
            return True
        if "database or disk is full" in str(exc) or "No space left" in str(exc):
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def fmt_bytes(n: int | float | None) -> str:
    """``3.1 MB``, ``512 kB``, ``17 bytes``; ``an unknown amount`` for None."""
    if n is None:
        return "an unknown amount"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} bytes"


class Notice:
    """Says "no space left" once, through every sink, until the disk has room again.

    Sinks are ``fn(message)`` callables (the journal, the headless front's link); the
    engine adds them when it is built. Thread-safe: the output relay, the flusher and the
    training thread all report here.
    """

    def __init__(self) -> None:
        self.sinks: list[Callable[[str], object]] = []
        self._lock = threading.Lock()
        self._said = False

    def full(self, run_dir: Path | str | None, what: str) -> bool:
        """The disk is full; ``what`` needed space (``checkpoint needs 5.2 MB``, ``output.log
        cannot be written``). Returns whether this call named it (the first since it had room)."""
        with self._lock:
            if self._said:
                return False
            self._said = True
        free = free_bytes(run_dir) if run_dir is not None else None
        self.say(f"no space left on the run dir's filesystem: {fmt_bytes(free)} free, {what}")
        return True

    def room_again(self, what: str = "") -> None:
        """Writes succeed again: the next full disk is named again."""
        with self._lock:
            said, self._said = self._said, False
        if said and what:
            self.say(what)

    @property
    def named(self) -> bool:
        return self._said

    def say(self, message: str) -> None:
        log.warning("%s", message)
        for sink in list(self.sinks):
            try:
                sink(message)
            except Exception:  # noqa: BLE001 - a sink must never fail a write path
                log.exception("a disk notice sink failed")


NOTICE = Notice()
"""The process's one notice: the full disk is named once, whoever meets it first."""


def make_reserve(run_dir: Path) -> None:
    """Hold back RESERVE_BYTES in the run dir (best effort: a nearly full disk skips it)."""
    path = Path(run_dir) / RESERVE
    try:
        fd = perms.open_file(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except OSError:
        return
    try:
        try:
            os.posix_fallocate(fd, 0, RESERVE_BYTES)
        except (OSError, AttributeError):
            os.write(fd, bytes(RESERVE_BYTES))
    except OSError:
        os.close(fd)
        path.unlink(missing_ok=True)
        return
    os.close(fd)


def release_reserve(run_dir: Path) -> bool:
    """Give the reserve back to the filesystem; whether there was one."""
    try:
        (Path(run_dir) / RESERVE).unlink()
    except OSError:
        return False
    return True
