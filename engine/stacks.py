"""This process's stacks, taken by one of ptdash's threads, and its collectives counted.

faulthandler's dump of every thread, from a thread other than the training thread, works
while that thread waits in a collective or a C call that releases the GIL, and while it spins
in Python (the interpreter hands the GIL over every switch interval, 5 ms); the dump is one C
call, so every thread's frames are of one moment. It cannot while C code holds
the GIL: then nothing in the process answers, and the hub says so from /proc (stackgather.py).
What is taken is a list of ``shared.stacks.RankStacks`` JSON objects.

``Collectives`` counts the script's torch.distributed calls (a wrapper that adds one to a
dict entry, no sync, no tensor touched), so that a rank that made one call fewer is named.
torch's flight recorder, read with the stacks (flight.py), has every collective of the process
groups, DDP's reducer's too.
"""

from __future__ import annotations

import faulthandler
import functools
import linecache
import os
import re
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

from . import flight
from .patching import Patches
from .shared.stacks import Frame, RankStacks, Thread

MAX_FRAMES = 60
"""Frames kept per thread, the innermost ones."""

COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
               "reduce_scatter_tensor", "reduce", "gather", "scatter", "all_to_all", "all_to_all_single",
               "barrier", "send", "recv", "isend", "irecv", "all_gather_object", "broadcast_object_list")
"""The torch.distributed functions counted (those the script may call by name)."""

_PTDASH = str(Path(__file__).resolve().parent)
_LIBS = tuple(sorted({p for k in ("stdlib", "platstdlib", "purelib", "platlib")
                      if (p := sysconfig.get_paths().get(k))}, key=len, reverse=True))


def script_root() -> str:
    """The directory of the script's own code where it lies among ptdash's or a package's
    files (the demo; ``-m pkg.train`` of an installed package: its top package), else "".
    Its files are the script's (``own``) however their path reads."""
    main = sys.modules.get("__main__")
    file, spec = getattr(main, "__file__", None), getattr(main, "__spec__", None)
    if not isinstance(file, str):
        return ""
    path = Path(os.path.abspath(file))  # as the frames name it
    dots = getattr(spec, "name", "").count(".")
    root = str(path.parents[dots - 1] if dots else path.parent)
    real = os.path.realpath(root)
    if real.endswith(("site-packages", "dist-packages")) or real in _LIBS or real == _PTDASH:
        root, real = str(path), os.path.realpath(path)  # a module of its own among others: that file
    under = real.startswith(_PTDASH + "/") or any(real.startswith(lib + "/") for lib in _LIBS)
    return root if under else ""


def _lib(path: str, root: str = "") -> str:
    """The package a file belongs to ("" for the script's own code, and below ``root``)."""
    if root and (path == root or path.startswith(root + "/")):
        return ""
    if path.startswith(_PTDASH):
        return "ptdash"
    if path.startswith("<"):
        return "python"
    for lib in _LIBS:
        if path.startswith(lib):
            rest = path[len(lib):].lstrip("/").split("/")
            if rest[0] in ("site-packages", "dist-packages") and len(rest) > 1:
                rest = rest[1:]
            return rest[0].removesuffix(".py") or "python"
    return ""


DUMPED_THREADS = 100
"""The most threads faulthandler dumps."""
_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-f]+) ")
_FRAME = re.compile(r'^  File "(.*)", line (\d+|\?\?\?) in (.*)$')
_ESCAPE = re.compile(r"\\(x[0-9a-f]{2}|u[0-9a-f]{4}|U[0-9a-f]{8})")


def _unescape(text: str) -> str:
    """faulthandler writes ASCII: a name's other characters as \\xe9, \\u00e9..."""
    return _ESCAPE.sub(lambda m: chr(int(m.group(1)[1:], 16)), text) if "\\" in text else text


def _dump() -> dict[int, list[tuple[str, int, str]]]:
    """Every thread's frames as ``(file, line, function)``, outermost first, its innermost
    ``MAX_FRAMES``, all at one moment: faulthandler walks them in C without letting another
    thread run. (Walked in Python, the training thread ran on between the threads' walks and
    a stack held frames it had left, each at the line it returned from.)"""
    fd = os.memfd_create("ptdash-stacks") if hasattr(os, "memfd_create") else None
    with (open(fd, "w+b") if fd is not None else tempfile.TemporaryFile()) as f:
        faulthandler.dump_traceback(f, all_threads=True)
        f.seek(0)
        text = f.read().decode("ascii", "replace")
    out: dict[int, list[tuple[str, int, str]]] = {}
    frames: list | None = None
    for line in text.splitlines():
        if m := _THREAD.match(line):
            frames = out.setdefault(int(m.group(1), 16), [])
        elif frames is not None and (m := _FRAME.match(line)) and len(frames) < MAX_FRAMES:
            line_no = int(m.group(2)) if m.group(2).isdigit() else 0
            frames.append((_unescape(m.group(1)), line_no, _unescape(m.group(3))))
    # faulthandler dumps at most 100 threads, the newest first: the others (the main thread
    # among them, in a process of many) are walked here, in Python.
    if len(out) >= DUMPED_THREADS:
        for ident, frame in sys._current_frames().items():
            if ident not in out:
                out[ident] = _walk(frame)
            frame = None  # a frame holds its locals alive
    return {ident: frames[::-1] for ident, frames in out.items()}


def _walk(frame) -> list[tuple[str, int, str]]:
    """A thread's frames, innermost first, as the dump lists them."""
    out = []
    while frame is not None and len(out) < MAX_FRAMES:
        out.append((frame.f_code.co_filename, frame.f_lineno or 0, frame.f_code.co_name))
        frame = frame.f_back
    return out


def _frames(walked: list[tuple], root: str = "") -> tuple[Frame, ...]:
    out = []
    for file, line, func in walked:
        if file == __file__:
            continue  # the counting wrapper around a collective
        lib = _lib(file, root)
        code = linecache.getline(file, line or 0).strip()
        out.append(Frame(file=file, line=line or 0, func=func, code=code[:200], own=not lib, lib=lib))
    return tuple(out)


class Collectives:
    """Counts of the script's torch.distributed calls, by name (installed with ``attach``)."""

    def __init__(self, step: Callable[[], int | None] = lambda: None) -> None:
        self.counts: dict[str, int] = {}
        self.last: dict[str, int | None] = {}
        """The step of each one's newest call."""
        self._step = step
        self._patches = Patches()

    def attach(self, patches: Patches | None = None) -> None:
        """Wrap torch.distributed's collectives; ``patches`` (default: its own) undoes it."""
        import torch.distributed as dist

        if not dist.is_available():
            return
        self._patches = patches or self._patches
        for name in COLLECTIVES:
            original = getattr(dist, name, None)
            if callable(original) and not hasattr(original, "_ptdash_counted"):
                self._patches.set(dist, name, self._wrap(name, original))

    def _wrap(self, name: str, original: Callable) -> Callable:
        counts, last, step = self.counts, self.last, self._step

        @functools.wraps(original)
        def counted(*args, **kwargs):
            counts[name] = counts.get(name, 0) + 1
            last[name] = step()
            return original(*args, **kwargs)

        counted._ptdash_counted = True
        return counted

    def detach(self) -> None:
        self._patches.undo()


class StackTaker:
    """Takes this process's stacks: ``take()`` from any thread but the training one.

    ``rank()`` and ``step()`` say who and where this process is; ``training`` is the ident of
    the thread that makes the steps (set at the first step; the main thread until then).
    """

    def __init__(self, rank: Callable[[], int], step: Callable[[], int | None],
                 collectives: Collectives | None = None, answers=None) -> None:
        self._rank, self._step, self.collectives = rank, step, collectives or Collectives(step)
        self.training: int | None = None
        if answers is not None:  # the rank link's reader answers the hub with these (distributed.py)
            answers.answer_stacks = self.take

    def here(self) -> None:
        """The calling thread is the training thread (the first step's hook says so)."""
        self.training = threading.get_ident()

    def take(self) -> dict:
        """This process's stacks, as a RankStacks JSON object (training thread first)."""
        me = threading.get_ident()
        training = self.training or threading.main_thread().ident
        names = {t.ident: t.name for t in threading.enumerate()}
        root = script_root()
        threads, dumped = [], _dump()
        recorded = flight.read()  # the collectives of the same moment, as near as can be
        for ident, frames in dumped.items():
            if ident == me:
                continue
            name = names.get(ident, f"thread {ident}")
            threads.append(Thread(name=name, training=ident == training, ptdash=name.startswith("ptdash"),
                                  frames=_frames(frames, root)))
        threads.sort(key=lambda t: (not t.training, t.ptdash, t.name))
        return RankStacks(rank=self._rank(), pid=os.getpid(), step=self._step(), threads=tuple(threads),
                          collectives=dict(self.collectives.counts), last_collective=dict(self.collectives.last),
                          wall=time.time(), flight=recorded).to_data()
