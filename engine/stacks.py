"""This process's stacks, taken by one of ptdash's threads, and its collectives counted.

``sys._current_frames()`` from a thread other than the training thread works while that
thread waits in a collective or a C call that releases the GIL, and while it spins in Python
(the interpreter hands the GIL over every switch interval, 5 ms). It cannot while C code holds
the GIL: then nothing in the process answers, and the hub says so from /proc (stackgather.py).
What is taken is a list of ``shared.stacks.RankStacks`` JSON objects.

``Collectives`` counts the script's torch.distributed calls (a wrapper that adds one to a
dict entry, no sync, no tensor touched), so that a rank that made one call fewer is named.
"""

from __future__ import annotations

import functools
import os
import sys
import sysconfig
import threading
import time
import traceback
from pathlib import Path
from typing import Callable

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


def _lib(path: str) -> str:
    """The package a file belongs to ("" for the script's own code)."""
    if path.startswith(_PTDASH):
        return "ptdash"
    if path.startswith("<"):
        return "python"
    for root in _LIBS:
        if path.startswith(root):
            rest = path[len(root):].lstrip("/").split("/")
            if rest[0] in ("site-packages", "dist-packages") and len(rest) > 1:
                rest = rest[1:]
            return rest[0].removesuffix(".py") or "python"
    return ""


def _frames(frame) -> tuple[Frame, ...]:
    out = []
    for entry in traceback.extract_stack(frame, limit=MAX_FRAMES):
        if entry.filename == __file__:
            continue  # the counting wrapper around a collective
        lib = _lib(entry.filename)
        out.append(Frame(file=entry.filename, line=entry.lineno or 0, func=entry.name, code=(entry.line or "")[:200],
                         own=not lib, lib=lib))
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
        threads = []
        for ident, frame in sys._current_frames().items():
            if ident == me:
                continue
            name = names.get(ident, f"thread {ident}")
            threads.append(Thread(name=name, training=ident == training, ptdash=name.startswith("ptdash"),
                                  frames=_frames(frame)))
            frame = None  # a frame holds its locals alive
        threads.sort(key=lambda t: (not t.training, t.ptdash, t.name))
        return RankStacks(rank=self._rank(), pid=os.getpid(), step=self._step(), threads=tuple(threads),
                          collectives=dict(self.collectives.counts), last_collective=dict(self.collectives.last),
                          wall=time.time()).to_data()
