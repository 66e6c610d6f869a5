"""The checkpoint files on disk: atomic writes, the space a save needs, the sweep of
killed saves' temp files, and keeping the newest K (checkpoint.py saves and loads them)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

from .shared import perms


def save_atomic(obj: dict, path: Path) -> int:
    """Write ``obj`` to ``path`` so that a crash leaves the old file or the new one, never
    half of one: temp file in the same directory, fsync, rename, fsync the directory.

    Returns the file's size in bytes.
    """
    perms.make_dir(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        # The run's file mode from the first byte: a checkpoint is the whole model.
        with os.fdopen(perms.open_file(tmp), "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return path.stat().st_size


_STEP_FILE = re.compile(r"^step-(\d+)\.pt$")
_STEP_DIR = re.compile(r"^step-(\d+)$")
_TEMP_FILE = re.compile(r"^\.step-\d+\.pt\.(\d+)\.tmp$")
SPACE_MARGIN = 1.05
"""A checkpoint's tensors plus this share for the pickle around them: what a save needs free."""


def needed_bytes(obj) -> int:
    """About what ``torch.save(obj)`` writes: the bytes of every tensor in it (and a margin)."""
    total, stack, seen = 0, [obj], set()
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            storage = item.untyped_storage()
            key = (storage.data_ptr(), storage.nbytes())
            if key not in seen:  # views of one storage are saved once
                seen.add(key)
                total += storage.nbytes()
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return int(total * SPACE_MARGIN) + 64 * 1024


def sweep_temp_files(directory: Path) -> list[Path]:
    """Remove the temp files of saves that were killed mid-write (their process is gone)."""
    from .shared.rundir import pid_alive

    removed = []
    try:
        entries = list(Path(directory).iterdir())
    except OSError:
        return removed
    for path in entries:
        m = _TEMP_FILE.match(path.name)
        if m and int(m.group(1)) != os.getpid() and not pid_alive(int(m.group(1))):
            try:
                if path.stat().st_uid == os.getuid():
                    path.unlink()
                    removed.append(path)
            except OSError:
                pass
    return removed


def sweep_runs(run_dir: Path) -> list[Path]:
    """At a run's start: the killed saves' temp files in this run and in its sibling runs."""
    removed = sweep_temp_files(Path(run_dir) / "checkpoints")
    try:
        siblings = [p for p in Path(run_dir).parent.iterdir() if p != Path(run_dir) and (p / "run.json").exists()]
    except OSError:
        siblings = []
    for sibling in siblings[:1000]:
        removed += sweep_temp_files(sibling / "checkpoints")
    return removed


def prune(directory: Path, keep_last: int) -> list[Path]:
    """Delete all but the newest ``keep_last`` checkpoints (step-N.pt files, and a sharded
    model's step-N directories); return what was removed."""
    import shutil

    found = sorted(
        (int(m.group(1)), p) for p in directory.glob("step-*") if (m := _STEP_FILE.match(p.name) or _STEP_DIR.match(p.name))
    )
    removed = [p for _, p in found[:-keep_last]] if keep_last > 0 else []
    for p in removed:
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
    return removed
