"""A full disk, named once and plainly, and the little space kept back for the run's end.

Every part that writes into the run dir (checkpoints, output.log, the store, run.json)
can meet a full filesystem. None of them may end training over it: each keeps going and
says so through ``NOTICE``, which names the full disk once ("no space left on the run
dir's filesystem: 3.1 MB free, checkpoint needs 5.2 MB") until it has room again.

``RESERVE`` is a small file made with the run dir, space held back for the history:
when the store meets a full disk it gives back a slice of it (``draw_reserve``) and
writes again, so the history stays writable while the reserve lasts; its last slice is
run.json's, given back for the run's last write, so a run always ends in a final state.
Checkpoints leave ``STORE_HEADROOM_BYTES`` free besides (``checkpoint_room``): the store's
WAL is bounded to about that, and a checkpoint never takes the room it needs. A run is
not started with less than ``START_BYTES`` free (``check_start``). Stdlib only (the CLI
makes the reserve).
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
RESERVE_BYTES = 2_000_000
"""Space held back in the run dir for the history (drawn on a slice at a time) and run.json's last write."""
RESERVE_SLICE_BYTES = 250_000
"""What the store gives back of the reserve at a time; the last slice is run.json's."""
STORE_HEADROOM_BYTES = 1_000_000
"""Free space a checkpoint leaves for the store: its WAL's bound (store.WAL_LIMIT_BYTES) and more."""
START_BYTES = RESERVE_BYTES + STORE_HEADROOM_BYTES
"""The least free space a run is started with: its reserve and the store's first room."""

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


class NoSpace(OSError):
    """Too little space to start a run; its message says so in words."""

    def __init__(self, message: str) -> None:
        super().__init__(errno.ENOSPC, message)

    def __str__(self) -> str:
        return self.strerror


def check_start(directory: Path | str, what: str) -> None:
    """Raise NoSpace unless ``directory``'s filesystem has START_BYTES free (``what``: the
    directory as the user named it)."""
    free = free_bytes(directory)
    if free is not None and free < START_BYTES:
        raise NoSpace(f"not enough space to start a run in {what}: {fmt_bytes(free)} free on its filesystem, "
                      f"a run needs {fmt_bytes(START_BYTES)} to start (its history, output and a "
                      f"{fmt_bytes(RESERVE_BYTES)} reserve that keeps the history writable on a full disk)")


def checkpoint_room(directory: Path | str) -> int | None:
    """The space a checkpoint may take in ``directory``: what is free less the store's headroom."""
    free = free_bytes(directory)
    return None if free is None else max(0, free - STORE_HEADROOM_BYTES)


def make_reserve(run_dir: Path) -> None:
    """Hold back RESERVE_BYTES in the run dir; NoSpace (and no reserve file) when it does not fit."""
    path = Path(run_dir) / RESERVE
    fd = perms.open_file(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        try:
            os.posix_fallocate(fd, 0, RESERVE_BYTES)
        except OSError as exc:
            if exc.errno in FULL_ERRNOS:
                raise
            _write_zeros(fd, RESERVE_BYTES)  # a filesystem without fallocate
    except OSError as exc:
        os.close(fd)
        path.unlink(missing_ok=True)
        if exc.errno in FULL_ERRNOS:
            raise NoSpace(f"not enough space for the run's {fmt_bytes(RESERVE_BYTES)} reserve in {run_dir} "
                          f"({fmt_bytes(free_bytes(run_dir))} free)") from None
        raise
    os.close(fd)


def _write_zeros(fd: int, count: int) -> None:
    """Write ``count`` zero bytes; a short write (the disk filled) raises ENOSPC."""
    chunk = bytes(64 << 10)
    done = 0
    while done < count:
        n = os.write(fd, chunk[:count - done])
        if n <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        done += n


def reserve_bytes(run_dir: Path | str) -> int:
    """What is left of the run dir's reserve."""
    try:
        return (Path(run_dir) / RESERVE).stat().st_size
    except OSError:
        return 0


def draw_reserve(run_dir: Path | str) -> int:
    """Give one slice of the reserve back to the filesystem, for the store's next write; the
    bytes given back (0 when only run.json's slice is left)."""
    path = Path(run_dir) / RESERVE
    size = reserve_bytes(run_dir)
    keep = max(RESERVE_SLICE_BYTES, size - RESERVE_SLICE_BYTES)
    if size <= RESERVE_SLICE_BYTES:
        return 0
    try:
        os.truncate(path, keep)
    except OSError:
        return 0
    return size - keep


def release_reserve(run_dir: Path) -> bool:
    """Give the reserve back to the filesystem; whether there was one."""
    try:
        (Path(run_dir) / RESERVE).unlink()
    except OSError:
        return False
    return True
