"""Finding runs: by path, by name or id, or the one live run when that choice is clear.
Stdlib only."""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from ptdash.shared import rundir
from ptdash.shared.config import RunInfo
from ptdash.shared.protocol import ENDED
from ptdash.shared.reader import StoreReader
from ptdash.shared.store import STORE_NAME, StoreError

from .errors import CliError

LS_STATES = {"running": "live", "starting": "starting", "pausing": "paused", "paused": "paused",
             "stopping": "stopping"}
"""How ``ptdash ls`` names the state of a run whose engine is alive."""


@dataclass(frozen=True)
class RunSummary:
    """One line of ``ptdash ls``."""

    path: Path
    info: RunInfo

    @cached_property
    def live(self) -> bool:
        """The engine is running (or paused) and can be attached to."""
        return self.info.status not in ENDED and rundir.engine_alive(self.info)

    @property
    def state(self) -> str:
        """``live``, ``stalled`` (no rank of a DDP run makes steps), ``paused``, ``finished``,
        ``crashed``, ``stopped`` or ``lost`` (and ``starting``/``stopping`` in passing)."""
        status = self.info.status
        if status in ENDED:
            return status
        if not self.live:
            # The engine died without recording its end (SIGKILL, power loss).
            return "lost" if self.info.pid else "starting"
        if status == "running" and self.info.stalled:
            return "stalled"
        return LS_STATES.get(status, status)

    @property
    def started(self) -> float:
        return float(self.info.started or self.info.created or 0)

    @cached_property
    def step(self) -> int | None:
        """The newest stored step (run.json's count when the store cannot say)."""
        try:
            with StoreReader(self.path / STORE_NAME) as reader:
                step = reader.last_step()
        except StoreError:
            step = None
        if step is None:
            return self.info.step
        return step


class Ambiguous(CliError):
    """More than one run fits: the message lists them (exit status 2), nothing is acted on."""

    def __init__(self, what: str, candidates: list[RunSummary]) -> None:
        lines = [f"  {r.path.name[:40]:<40} {r.state:<9} {'' if r.step is None else f'{r.step:,}':>9}  {r.path}"
                 for r in candidates]
        super().__init__(f"{len(candidates)} {what}, so none was chosen; name one (a run dir, name or id):\n"
                         + "\n".join(lines), 2)
        self.candidates = candidates


def all_runs(root: Path | None = None, everywhere: bool = False) -> list[RunSummary]:
    """Runs under ``root`` (default ./ptdash-runs) plus every registered live run, oldest first;
    with ``everywhere``, every run the user created anywhere (``rundir.recorded``) too.

    A run this user cannot read (another user's, private) is left out.
    """
    root = Path(root or rundir.DEFAULT_ROOT)
    dirs = {p.resolve() for p in root.glob("*/") if _readable_run(p)} if root.is_dir() else set()
    dirs.update(p.resolve() for p in rundir.registered())
    if everywhere:
        dirs.update(p.resolve() for p in rundir.recorded())
    runs = []
    for d in dirs:
        try:
            runs.append(RunSummary(d, rundir.read_info(d)))
        except (OSError, ValueError):
            continue
    return sorted(runs, key=lambda r: r.started)


def _readable_run(path: Path) -> bool:
    try:
        return (path / rundir.RUN_JSON).is_file()
    except OSError:  # a private run dir of another user
        return False


def resolve(spec: str | None, live_only: bool = False, everywhere: bool = False) -> RunSummary:
    """The run named by ``spec``: a run dir, a run's id or name, or a part of a name only one
    run has.

    With no ``spec`` and ``live_only`` (``ctl``, ``attach``), only a clear choice is made:
    the one live run under ./ptdash-runs, else this user's one live run anywhere. With
    no ``spec`` otherwise (``doctor``), the newest run. With ``everywhere``, a name is
    looked for among every run the user created (``ls --all``). Raises LookupError with a
    one-line message when nothing fits, and Ambiguous listing the candidates when several do.
    """
    if spec:
        try:
            if (Path(spec) / rundir.RUN_JSON).is_file():
                path = Path(spec).resolve()
                return RunSummary(path, rundir.read_info(path))
        except PermissionError:
            raise LookupError(f"cannot read run {spec}: permission denied (it is another user's)") from None
    runs = all_runs(everywhere=everywhere)
    if spec:
        exact = [r for r in runs if spec in (r.path.name, r.info.id, r.info.name)]
        runs = exact or [r for r in runs if spec in r.path.name]
    live = "live " if live_only else ""
    if live_only:
        runs = [r for r in runs if r.live]
    which = f"{live}runs match {spec!r}"
    if not spec and not live_only:
        runs = runs[-1:]
    elif not spec:
        here = [r for r in runs if r.path.parent == Path(rundir.DEFAULT_ROOT).resolve()]
        runs, which = (here, f"live runs are under ./{rundir.DEFAULT_ROOT}") if here else (runs, "of your runs are live")
    if not runs:
        what = f"matching {spec!r}" if spec else ""
        raise LookupError(f"no {live}run {what}".replace("  ", " ").strip() + " (see `ptdash ls`)")
    if len(runs) > 1:
        raise Ambiguous(which, runs)
    return runs[0]


def parent_of(run_dir: Path) -> tuple[Path, ...]:
    """The run ``run_dir`` was forked from (``ptdash fork``), while its dir is there; else ()."""
    try:
        parent = rundir.read_info(run_dir).parent
    except (OSError, ValueError):
        return ()
    return (Path(parent),) if parent and (Path(parent) / rundir.RUN_JSON).is_file() else ()


def age(seconds: float) -> str:
    """``42s``, ``5m``, ``3h``, ``2d``."""
    seconds = max(0.0, time.time() - seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"
