"""Host CPU and memory, this process's, and its DataLoader workers' (children)."""

from __future__ import annotations

import math
import os
import time
from typing import Any

import psutil

from .na import NA, _NAType


def descendant_pids(pid: int) -> list[int] | None:
    """Every process below ``pid``, from the kernel's per-thread children lists.

    Reads ``/proc/<pid>/task/<tid>/children`` (Linux, CONFIG_PROC_CHILDREN): a few files
    per process in the tree, where listing children through psutil reads every process
    on the machine. None where those files do not exist.
    """
    out: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            if parent == pid:
                return None
            continue  # a descendant that just exited
        for tid in tasks:
            try:
                with open(f"/proc/{parent}/task/{tid}/children", "rb") as f:
                    children = [int(c) for c in f.read().split()]
            except FileNotFoundError:
                if not os.path.exists(f"/proc/{parent}/task/{tid}"):
                    continue  # the thread ended meanwhile
                return None  # the kernel does not keep children lists
            except OSError:
                continue
            out.extend(children)
            todo.extend(children)
    return out


class HostSampler:
    """CPU and memory of the host, this process, and its children (DataLoader workers).

    CPU percentages are averages since the previous ``sample()``, so the first one is
    ``NA``. Process CPU is in units of one core (200 = two busy cores), as in top.
    """

    def __init__(self, proc: psutil.Process | None = None, children_every_s: float = 2.0) -> None:
        if children_every_s < 0:
            raise ValueError(f"children_every_s must be >= 0, got {children_every_s}")
        self._proc = proc or psutil.Process()
        self._children_every_s = children_every_s
        self._children: dict[int, psutil.Process] = {}
        self._children_at = -math.inf
        self._cpu_times: tuple[float, float] | None = None
        self._primed = False

    def pids(self) -> list[int]:
        """This process and its known children."""
        return [self._proc.pid, *self._children]

    def sample(self) -> dict[str, Any]:
        """Keys: ``cpu_pct`` (machine, 0-100), ``proc_cpu_pct``, ``workers_cpu_pct``,
        ``rss_bytes``, ``workers_rss_bytes``, ``workers`` (count), ``mem_used_bytes``,
        ``mem_total_bytes`` (machine; used = total - available)."""
        primed = self._primed
        self._primed = True
        try:
            with self._proc.oneshot():
                proc_cpu = self._proc.cpu_percent()
                rss = self._proc.memory_info().rss
        except psutil.Error:
            proc_cpu, rss = NA, NA
        workers_cpu, workers_rss = self._sample_children()
        memory = psutil.virtual_memory()
        return {
            "cpu_pct": self._machine_cpu_pct(),
            "proc_cpu_pct": proc_cpu if primed else NA,
            "workers_cpu_pct": workers_cpu if primed else NA,
            "rss_bytes": rss,
            "workers_rss_bytes": workers_rss,
            "workers": len(self._children),
            "mem_used_bytes": memory.total - memory.available,
            "mem_total_bytes": memory.total,
        }

    def _sample_children(self) -> tuple[float, int]:
        # The list of children is refreshed every few seconds; known children are read each time.
        now = time.monotonic()
        if now - self._children_at >= self._children_every_s:
            self._children_at = now
            pids = descendant_pids(self._proc.pid)
            found = []
            if pids is None:  # no /proc/<pid>/task/<tid>/children here: scan every process
                try:
                    found = self._proc.children(recursive=True)
                except psutil.Error:
                    pass
            for pid in pids or ():
                try:
                    found.append(psutil.Process(pid))
                except psutil.Error:
                    pass  # already gone
            # Keep the old Process objects: they carry the CPU-time baseline. Equality
            # also compares creation time, so a recycled PID gets a fresh object.
            known = self._children
            self._children = {c.pid: known[c.pid] if known.get(c.pid) == c else c for c in found}
        cpu, rss = 0.0, 0
        for pid, child in list(self._children.items()):
            try:
                with child.oneshot():
                    # A child's first reading is 0.0 (no baseline yet): it shows up one sample late.
                    cpu += child.cpu_percent()
                    # RSS counts copy-on-write pages shared with the parent again in every
                    # fork()ed worker; USS would not, but reading smaps is far too slow here.
                    rss += child.memory_info().rss
            except psutil.Error:
                del self._children[pid]
        return cpu, rss

    def _machine_cpu_pct(self) -> float | _NAType:
        times = psutil.cpu_times()
        # As psutil does: guest time is already inside user time, and iowait is idle.
        total = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
        busy = total - times.idle - getattr(times, "iowait", 0.0)
        previous, self._cpu_times = self._cpu_times, (busy, total)
        if previous is None or total <= previous[1]:
            return NA
        return min(100.0, max(0.0, 100.0 * (busy - previous[0]) / (total - previous[1])))
