"""The run directory: where one run's metadata, history, output and checkpoints live.

```
ptdash-runs/20261130-101500-train/
  run.json          metadata and state (argv, cwd, git, host, status, exit code, socket)
  token             the control socket's secret (0600)
  metrics.db        the metrics store (see store.py)
  output.log        the script's stdout and stderr
  engine.log        the engine's own diagnostics
  checkpoints/      step-<N>.pt
  profiles/         profiler traces
```

The run dir is private to its owner (0700, its files 0600), or shared with a group
(2750/0640): see perms.py.

Two per-user registries, each a folder of ``<id>`` files holding a run dir's path:
``<private dir>/runs/`` lists the live runs (the engine adds and removes itself), so
``ptdash attach`` and ``ptdash ls`` find them from any directory; ``$XDG_STATE_HOME/ptdash/all-runs/``
(default ``~/.local/state``) lists every run ever created, for ``ptdash ls --all``: the
private dir is usually a tmpfs that a reboot empties, a run's history is not.
Stdlib only.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import secrets
import socket
import threading
import time
from pathlib import Path

from . import diskspace, perms
from .config import ConfigError, RunInfo
from .private import private_dir
from .protocol import ENDED

DEFAULT_ROOT = "ptdash-runs"
RUN_JSON = "run.json"


def create(root: Path, name: str, exact: bool = False, group: int | None = None, listed: bool = True,
           **fields) -> Path:
    """Make a new run dir under ``root`` with its token and an initial run.json.

    The dir is ``root/<time>-<name>``, or ``root/<name>`` when ``exact`` (an empty
    existing directory is reused then). It is private to this user, or readable by
    ``group`` (a gid). ``fields`` are RunInfo fields (argv, config...). ``listed``: in the
    list of every run (``ptdash ls --all``); a node's own dir (node_dir) is not.
    """
    sockets = private_dir()  # first: an unsafe socket directory leaves nothing behind
    stamp = time.strftime("%Y%m%d-%H%M%S")
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-")[:40] or "run"
    where = Path(root)
    while not where.exists() and where != where.parent:
        where = where.parent
    diskspace.check_start(where, str(root / name) if exact else str(root))  # before anything is made
    root.mkdir(parents=True, exist_ok=True)
    if exact:
        path = root / name
        existed = path.is_dir()
        perms.make_run_dir(path, group, exist_ok=True)
    else:
        existed = False
        for n in range(1000):
            path = root / (f"{stamp}-{slug}" + (f"-{n}" if n else ""))
            try:
                perms.make_run_dir(path, group)
                break
            except FileExistsError:
                continue
    try:
        return _fill(path, name, sockets, group, listed, fields)
    except BaseException:
        # A start that cannot be made (a disk filling meanwhile) leaves nothing behind:
        # no half run dir, no reserve holding the last of the disk.
        for made in sorted(path.iterdir(), reverse=True) if path.is_dir() else ():
            if made.is_file() or made.is_symlink():
                made.unlink(missing_ok=True)
        if not existed:
            try:
                path.rmdir()
            except OSError:
                pass
        raise


def _fill(path: Path, name: str, sockets: Path, group: int | None, listed: bool, fields: dict) -> Path:
    """A new run dir's token, run.json and reserve; the run is recorded last."""
    run_id = secrets.token_hex(4)
    token_path = path / "token"
    # 0600 even in a shared run: its group may read the run, never steer it.
    fd = os.open(token_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    info = RunInfo(id=run_id, name=name, run_dir=str(path.resolve()), socket=str(sockets / f"{run_id}.sock"),
                   host=socket.gethostname(), user_uid=os.getuid(), created=time.time(), **fields)
    write_info(path, info)
    diskspace.make_reserve(path)
    if listed:
        record(run_id, path)
    return path


NODES = ".nodes"


def create_node_dir(root: Path, name: str, node: int, **fields) -> Path:
    """The dir of a node other than the hub's in a job of several nodes: its ranks' run.json
    (their options), engine.log and a copy of their output. The run itself, its store and
    its dashboards are on node 0; this dir is not a run (not listed, under ``root/.nodes``)."""
    return create(Path(root) / NODES, f"{name}-node{node}", listed=False, **fields)


def read_info(run_dir: Path) -> RunInfo:
    """The run's metadata; raises FileNotFoundError or ValueError with a clear message."""
    path = Path(run_dir) / RUN_JSON
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{run_dir} is not a ptdash run (no {RUN_JSON})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path} is damaged: {exc}") from None
    try:
        return RunInfo.from_json(data)
    except ConfigError as exc:
        raise ValueError(f"{path} is damaged: {exc}") from None


def write_info(run_dir: Path, info: RunInfo) -> None:
    """Replace run.json atomically, so a reader never sees half of it.

    The run's last write (an ended state with its end time) on a full disk gives back the
    run dir's reserve (diskspace.RESERVE) and tries again: a run must always be able to
    say how it ended. Earlier writes leave the reserve for that one.
    """
    path = Path(run_dir) / RUN_JSON
    text = json.dumps(info.to_json(), indent=2, default=str)
    last = info.status in ENDED and info.ended is not None
    try:
        _replace(path, text)
    except OSError as exc:
        if not (last and diskspace.is_full(exc) and diskspace.release_reserve(run_dir)):
            raise
        _replace(path, text)
    if last:
        diskspace.release_reserve(run_dir)


def _replace(path: Path, text: str) -> None:
    # Per thread: the engine's threads each write run.json (update_info serialises them).
    tmp = path.with_name(f".{RUN_JSON}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with os.fdopen(perms.open_file(tmp), "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk must not also leave a half-written temp file
        raise


def update_info(run_dir: Path, **changes) -> RunInfo:
    """Set RunInfo fields in run.json and return the result."""
    unknown = set(changes) - RunInfo.fields()
    if unknown:
        raise TypeError(f"run.json has no field {', '.join(sorted(unknown))}")
    with _UPDATES:  # the engine's threads each update run.json: none may undo another's change
        info = dataclasses.replace(read_info(run_dir), **changes)
        write_info(run_dir, info)
    return info


_UPDATES = threading.RLock()


def read_token(run_dir: Path) -> str:
    return (Path(run_dir) / "token").read_text().strip()


# ------------------------------------------------------------------ live-run registry


def _registry() -> Path:
    path = private_dir() / "runs"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def register(run_id: str, run_dir: Path) -> None:
    """Record a live run so ``ptdash attach`` finds it from any directory."""
    (_registry() / run_id).write_text(str(Path(run_dir).resolve()))


def unregister(run_id: str) -> None:
    try:
        (_registry() / run_id).unlink()
    except FileNotFoundError:
        pass


def registered() -> list[Path]:
    """Run dirs of registered runs whose run.json still exists."""
    return _pointed_dirs(_registry().iterdir())


# ------------------------------------------------------------------ a torchrun job's ranks


def _job_file(job: str) -> Path:
    folder = private_dir() / "jobs"
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder / "".join(c if c.isalnum() or c in "-_." else "_" for c in job)[:100]


def announce_job(job: str, run_dir: Path) -> None:
    """Rank 0 of a plain ``torchrun -m ptdash.bootstrap`` job: say where its run dir is, for
    the job's other ranks (through the user's private directory, not the job's TCP store)."""
    path = _job_file(job)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(str(Path(run_dir).resolve()))
    os.replace(tmp, path)


def forget_job(job: str) -> None:
    try:
        _job_file(job).unlink()
    except OSError:
        pass


def find_job(job: str, timeout: float = 60.0) -> Path | None:
    """Another rank of such a job: the run dir its rank 0 announced (waiting for it a while)."""
    path, deadline = _job_file(job), time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            run_dir = Path(path.read_text().strip())
        except OSError:
            time.sleep(0.1)
            continue
        if (run_dir / RUN_JSON).exists():
            return run_dir
        time.sleep(0.1)
    return None


# ------------------------------------------------------------------ every run, live or not


def _all_runs() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "ptdash" / "all-runs"


def record(run_id: str, run_dir: Path) -> None:
    """Add a run to the list of every run (``ptdash ls --all``).

    Best effort: a home that cannot be written loses only that list, never the run.
    """
    try:
        folder = _all_runs()
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        (folder / run_id).write_text(str(Path(run_dir).resolve()))
    except OSError:
        pass


def recorded() -> list[Path]:
    """Run dirs of every recorded run that still exists; the records of removed ones are pruned."""
    try:
        entries = list(_all_runs().iterdir())
    except OSError:
        return []
    return _pointed_dirs(entries)


def _pointed_dirs(entries) -> list[Path]:
    """The run dirs named by ``entries`` (files holding a run dir's path) whose run.json
    still exists; an entry naming anything else is removed, an unreadable one skipped."""
    dirs = []
    for entry in entries:
        try:
            path = Path(entry.read_text().strip())
        except (OSError, UnicodeDecodeError):
            continue
        if path.is_absolute() and (path / RUN_JSON).exists():
            dirs.append(path)
        else:
            entry.unlink(missing_ok=True)
    return dirs


def engine_alive(info: RunInfo) -> bool:
    """Whether the process run.json names is alive and is still a ptdash engine.

    The command line is checked (where /proc has it) so that a pid reused by another
    program after the engine died does not keep a lost run looking live.
    """
    pid = info.pid
    if not isinstance(pid, int) or not pid_alive(pid):
        return False
    try:
        return b"ptdash" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True


def pid_alive(pid: int | None) -> bool:
    """Whether a process with this pid exists (ours or not)."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
