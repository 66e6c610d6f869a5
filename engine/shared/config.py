"""A run's typed settings (``RunConfig``) and its metadata file, run.json (``RunInfo``).

``RunConfig`` is what the ``ptdash`` command was asked for: the CLI builds it (so a bad
value is refused before anything starts), run.json carries it, and the engine reads it.
``RunInfo`` is run.json itself: one schema for its one writer (``rundir``) and every
reader. Both validate in ``__post_init__``; ``from_json`` of a file written by another
version keeps what it knows and drops the rest.

Stdlib only.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from .limits import BOUNDS, check_setting
from .protocol import STATES

ANOMALY_ACTIONS = ("pause", "skip", "warn", "rollback")
"""What a non-finite loss or gradient does: pause before the update, skip it, only warn, or
roll back to the last good state (which a loss or gradient-norm spike does too)."""


class ConfigError(ValueError):
    """A setting that cannot be used; the message is one line naming it."""


def _positive(name: str, value: float | None, allow_none: bool = True) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name} must be a finite number > 0, got {value!r}")


def _setting(name: str, value: float | None) -> None:
    # The same ranges as the live commands (limits.BOUNDS): a bad --lr-scale is refused
    # before the run starts, not at its first step.
    error = None if value is None else check_setting(name, value)
    if error:
        raise ConfigError(f"{name}: {error}")


def _count(name: str, value: int | None, least: int) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ConfigError(f"{name} must be a whole number >= {least}, got {value!r}")


@dataclass(frozen=True)
class RunConfig:
    """How ptdash instruments one run: the options given before the script."""

    clip: float | None = None
    """Gradient-clip norm to enforce from the first step (None: the script's own clipping)."""
    lr_scale: float | None = None
    """Factor on every param group's LR from the first step (None: 1, or the checkpoint's on resume)."""
    checkpoint_every: int | None = None
    """Save a checkpoint every this many steps."""
    checkpoint_every_s: float | None = None
    """Save a checkpoint every this many seconds."""
    keep_last: int | None = None
    """Keep only the newest this many step checkpoints (None: keep all)."""
    resume: str | None = None
    """Absolute path of a ptdash checkpoint to load at the first forward pass."""
    on_anomaly: str = "pause"
    """One of ANOMALY_ACTIONS."""
    profile_steps: tuple[int, int] | None = None
    """Optimizer steps ``(first, last)`` to profile with torch.profiler."""
    memory_history: bool = False
    """Record CUDA allocations for a snapshot on out-of-memory."""
    update_ratio_every: int = 100
    """Measure update/weight ratios every this many steps (0: never)."""
    stall_seconds: float = 120.0
    """Name a rank that makes no step for this long."""
    detect_anomaly: bool = False
    """Autograd anomaly detection, so a failing backward names its forward line."""
    flush_interval: float | None = None
    """Seconds between the flusher's moves of step records to the store; None: a quarter of
    a second, or a second while the cost budget thins the sampling (flusher.py)."""
    overhead_budget: float = 1.0
    """The share of each step's time, in percent, that ptdash's own work on the training
    thread may take; above it the per-layer statistics are thinned (budget.py). 100: never thin."""
    steps: int | None = None
    """The run's length in optimizer steps (``--steps``), when its schedule does not say;
    only informs the display (the total, the ETA and how far the LR schedule is previewed)."""
    pause_timeout: float | None = None
    """Seconds a pause may last with nobody resuming it before the run stops cleanly
    (None: it waits for as long as it takes)."""
    parse_output: bool = True
    """Read the metrics the script prints (``val loss 2.29``) into ``printed/<name>`` series
    (printed.py); ``--no-parse-output`` turns it off."""
    rollback_every: int | None = None
    """Refresh the rollback snapshot every this many steps (None: as the cost budget affords;
    kept with ``on_anomaly`` rollback, or when this is given)."""
    rollback_memory: int | None = None
    """Host bytes the rollback snapshots may take (None: a quarter of the machine's memory)."""
    rollback_lr: tuple[float, int] | None = None
    """``(factor, steps)``: after a rollback, the LR factor times ``factor`` for ``steps`` steps."""
    rollback_limit: tuple[int, int] = (3, 1000)
    """``(n, m)``: more than n rollbacks within m steps pause the run (stop it, unattended)."""

    def __post_init__(self) -> None:
        _setting("clip", self.clip)
        _setting("lr_scale", self.lr_scale)
        _count("checkpoint_every", self.checkpoint_every, 1)
        _positive("checkpoint_every_s", self.checkpoint_every_s)
        _count("keep_last", self.keep_last, 1)
        _count("update_ratio_every", self.update_ratio_every, 0)
        _count("steps", self.steps, 1)
        _positive("stall_seconds", self.stall_seconds, allow_none=False)
        _positive("flush_interval", self.flush_interval)
        _positive("overhead_budget", self.overhead_budget, allow_none=False)
        if self.overhead_budget > 100:
            raise ConfigError(f"overhead_budget is a percentage, at most 100, got {self.overhead_budget!r}")
        _positive("pause_timeout", self.pause_timeout)
        _count("rollback_every", self.rollback_every, 1)
        _count("rollback_memory", self.rollback_memory, 1)
        if self.rollback_lr is not None:
            lr = tuple(self.rollback_lr)
            if len(lr) != 2 or isinstance(lr[0], bool) or not isinstance(lr[0], (int, float)) \
                    or not 0 < lr[0] <= 1 or isinstance(lr[1], bool) or not isinstance(lr[1], int) or lr[1] < 1:
                raise ConfigError(f"rollback_lr must be (factor, steps) with 0 < factor <= 1 and steps >= 1, "
                                  f"got {self.rollback_lr!r}")
            object.__setattr__(self, "rollback_lr", (float(lr[0]), lr[1]))
        limit = tuple(self.rollback_limit) if isinstance(self.rollback_limit, (list, tuple)) else ()
        if len(limit) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in limit):
            raise ConfigError(f"rollback_limit must be (n, m), whole numbers >= 1, got {self.rollback_limit!r}")
        object.__setattr__(self, "rollback_limit", limit)
        if self.on_anomaly not in ANOMALY_ACTIONS:
            raise ConfigError(f"on_anomaly must be one of {', '.join(ANOMALY_ACTIONS)}, got {self.on_anomaly!r}")
        if self.resume is not None and not isinstance(self.resume, str):
            raise ConfigError(f"resume must be a path, got {self.resume!r}")
        if self.profile_steps is not None:
            steps = tuple(self.profile_steps)
            if len(steps) != 2 or not all(isinstance(s, int) and not isinstance(s, bool) for s in steps) \
                    or not 1 <= steps[0] <= steps[1]:
                raise ConfigError(f"profile_steps must be (first, last) with 1 <= first <= last, got {self.profile_steps!r}")
            if steps[1] - steps[0] + 1 > BOUNDS["profile"].high:
                raise ConfigError(f"profile_steps covers {steps[1] - steps[0] + 1} steps; "
                                  f"a profile is {BOUNDS['profile'].text}")
            object.__setattr__(self, "profile_steps", steps)
        for name in ("memory_history", "detect_anomaly", "parse_output"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, got {getattr(self, name)!r}")

    def to_json(self) -> dict:
        """The JSON object run.json stores."""
        out = dataclasses.asdict(self)
        for name in ("profile_steps", "rollback_lr", "rollback_limit"):
            if getattr(self, name) is not None:
                out[name] = list(getattr(self, name))
        return out

    @classmethod
    def from_json(cls, data: Any) -> RunConfig:
        """The config in a JSON object; keys this version does not know are ignored.

        Raises ConfigError when a known key has a value that cannot be used.
        """
        if not isinstance(data, dict):
            raise ConfigError("the run's config must be a JSON object")
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        if isinstance(values.get("rollback_lr"), list) and values["rollback_lr"] and type(values["rollback_lr"][0]) is int:
            values["rollback_lr"] = [float(values["rollback_lr"][0]), *values["rollback_lr"][1:]]
        for name in ("stall_seconds", "flush_interval", "clip", "lr_scale", "checkpoint_every_s", "overhead_budget"):
            if isinstance(values.get(name), int) and not isinstance(values[name], bool):
                values[name] = float(values[name])
        try:
            return cls(**values)
        except TypeError as exc:
            raise ConfigError(f"bad config: {exc}") from None


_TYPES = {"str": str, "int": int, "float": (int, float), "bool": bool, "list": list, "dict": dict}


@dataclass
class RunInfo:
    """run.json: who a run is, where its files are, and how far it got.

    Written only through ``rundir`` (created by the CLI, updated by the engine and the
    launcher); read by every part that finds, lists, shows or steers runs.
    """

    id: str
    """Short random id; names the control socket."""
    name: str
    run_dir: str
    """Absolute path of the run dir."""
    socket: str
    """Path of the control socket."""
    host: str = ""
    user_uid: int | None = None
    created: float = 0.0
    status: str = "starting"
    """One of STATES."""
    argv: list = field(default_factory=list)
    """The script (or ``-m module``) and its arguments."""
    cwd: str = ""
    python: str | None = None
    config: RunConfig = field(default_factory=RunConfig)
    git: str | None = None
    """The commit of the script's repository, when it is in one."""
    ptdash_version: str | None = None
    pid: int | None = None
    """The engine's process (rank 0's under DDP)."""
    launcher_pid: int | None = None
    """The process the CLI started: the engine itself, or the DDP launcher."""
    nproc_per_node: int | None = None
    started: float | None = None
    """When the engine started (``time.time()``)."""
    torch_version: str | None = None
    start_step: int | None = None
    """The step a resumed run continued from."""
    world_size: int | None = None
    step: int | None = None
    """The newest completed step the engine reported."""
    total_steps: int | None = None
    """The step the run is known to end at (a scheduler's length), when known."""
    paused_at: int | None = None
    clip: float | None = None
    """The live clip-norm override (None: the script's own clipping)."""
    lr_scale: float | None = None
    exit_code: int | None = None
    ended: float | None = None
    detail: str | None = None
    """How the run ended, in one line (a crash's last line, the failed rank)."""
    error: str | None = None
    """Why the engine could not start."""
    rank_failures: list | None = None
    """``[{"rank", "exitcode"}]`` of the ranks that failed, first failure first."""
    stalled: str | None = None
    """While no rank makes steps (DDP): which rank stalled and why; None otherwise."""
    hosts: dict | None = None
    """Rank (as text) -> the host it runs on, once every rank reached the hub (DDP)."""
    lost_nodes: list | None = None
    """``[{"node", "host", "ranks"}]`` of the nodes lost during the run (several nodes)."""
    parent: str | None = None
    """The run dir of the run this one was forked from (``ptdash fork``), or None."""
    parent_id: str | None = None
    """That run's id."""
    fork_step: int | None = None
    """The parent's step this run was forked at: the step of the checkpoint it started from."""

    def __post_init__(self) -> None:
        if self.status not in STATES:
            raise ConfigError(f"status must be one of {', '.join(STATES)}, got {self.status!r}")

    @property
    def ended_cleanly(self) -> bool:
        return self.status in ("finished", "stopped")

    def to_json(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["config"] = self.config.to_json()
        return out

    @classmethod
    def from_json(cls, data: Any) -> RunInfo:
        """run.json's object as a RunInfo.

        A field of the wrong type reads as missing (its default) rather than failing the
        whole file, so a hand-edited or half-foreign run.json still lists and shows; a
        file without the identifying fields raises ConfigError.
        """
        if not isinstance(data, dict):
            raise ConfigError("run.json must hold a JSON object")
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name not in data:
                continue
            value = data[f.name]
            if f.name == "config":
                try:
                    values["config"] = RunConfig.from_json(value)
                except ConfigError:
                    pass
                continue
            base = str(f.type).split("|")[0].strip()
            expected = _TYPES.get(base)
            if value is None or expected is None or (isinstance(value, expected) and not (
                    base in ("int", "float") and isinstance(value, bool))):
                values[f.name] = float(value) if base == "float" and isinstance(value, int) else value
        if values.get("status") not in STATES:
            values.pop("status", None)
        missing = [name for name in ("id", "name", "run_dir", "socket") if not isinstance(values.get(name), str)]
        if missing:
            raise ConfigError(f"run.json lacks {', '.join(missing)}")
        return cls(**values)

    @staticmethod
    def fields() -> frozenset[str]:
        """The names a writer may set."""
        return frozenset(f.name for f in dataclasses.fields(RunInfo))
