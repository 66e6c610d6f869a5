"""Checkpoints of sharded models (FSDP2, FSDP1) through ``torch.distributed.checkpoint``.

No rank holds the whole model, so every rank writes its shards: one directory per
checkpoint, ``checkpoints/step-N/``, holding DCP's files (``.metadata`` and one
``__R_0.distcp`` per rank: the models' and optimizers' sharded state dicts from
``torch.distributed.checkpoint.state_dict``), ``ptdash.pt`` (rank 0: the step, the live
settings and the command journal, as in a one-file checkpoint) and ``rank-R.pt`` (each
rank's RNG states, schedulers and scalers). Atomic: every rank writes into
``.step-N.partial``, and rank 0 renames it once every rank has written (the rank
channel's barrier), so a crash leaves no ``step-N`` or a whole one. A resumed run loads it
back on every rank at its first forward, resharded by DCP for the shards of that run.

Saving and loading are collectives on the script's process group (DCP's planning and
DCP's barriers), made where every rank is anyway: at the same step boundary (commands
reach every rank at one step) or at the first forward.
"""

from __future__ import annotations

import os
import shutil
import time
import warnings
from pathlib import Path

import torch

from .checkpoint_files import save_atomic
from .discovery import model_names
from .shared import perms

META = "ptdash.pt"
"""Rank 0's file in a sharded checkpoint's directory: ptdash's own state (its ``"ptdash"``
dict is what a one-file checkpoint's is, with ``"sharded": True``)."""


def is_sharded_checkpoint(path: Path) -> bool:
    return Path(path).is_dir() and (Path(path) / META).is_file()


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _state(models: list, optimizers: list) -> tuple[dict, dict, list]:
    """The DCP state of the models and optimizers (sharded state dicts; of an optimizer its
    ``state``), the optimizers' ``param_groups`` (plain values, kept in the rank's own file:
    DCP does not load FSDP1's back), and each optimizer's model (the one holding its first
    parameter)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    owners = []
    for opt in optimizers:
        first = next((p for g in opt.param_groups for p in g["params"]), None)
        owners.append(next((m for m in models if any(p is first for p in m.parameters())), None))
    with _quiet():
        state = {"models": {n: get_model_state_dict(m) for n, m in zip(model_names(models), models)},
                 "optimizers": {}}
    groups = {}
    with _optimizers_unhooked(), _quiet():  # DCP steps an optimizer with no state yet once, at LR 0
        for i, (opt, owner) in enumerate(zip(optimizers, owners)):
            if owner is not None:
                osd = get_optimizer_state_dict(owner, opt)
                state["optimizers"][str(i)], groups[str(i)] = osd["state"], osd["param_groups"]
    return state, groups, owners


class _optimizers_unhooked:
    """Without the global optimizer step hooks: the step DCP makes to create an optimizer's
    state (``_init_optim_state``, LR 0, zero gradients) is not a training step."""

    def __enter__(self):
        from torch.optim import optimizer

        self._saved = [(hooks, dict(hooks)) for hooks in (optimizer._global_optimizer_pre_hooks,
                                                            optimizer._global_optimizer_post_hooks)]
        for hooks, _ in self._saved:
            hooks.clear()

    def __exit__(self, *_):
        for hooks, saved in self._saved:
            hooks.update(saved)


class _quiet(warnings.catch_warnings):
    """Without the warnings torch's own checkpointing code gives about itself (FSDP1's
    ShardedTensor deprecation, its device guesses): they are not the script's."""

    def __enter__(self):
        super().__enter__()
        warnings.simplefilter("ignore")


def save(directory: Path, step: int, models: list, optimizers: list, schedulers: list, scalers: list,
         meta: dict, rng: dict, barrier) -> tuple[Path, int]:
    """Write ``directory/step-<step>/`` (every rank, at the same step): ``meta`` is ptdash's
    state (rank 0's), ``rng`` this rank's RNG states; its path and size (rank 0's count of
    every file). ``barrier()`` is the rank channel's."""
    import torch.distributed.checkpoint as dcp

    rank = _rank()
    final, partial = directory / f"step-{step}", directory / f".step-{step}.partial"
    if rank == 0:
        perms.make_dir(directory)
        for stale in directory.glob(".step-*.partial"):  # saves killed mid-write
            shutil.rmtree(stale, ignore_errors=True)
        perms.make_dir(partial)
    barrier()  # the directory is there, empty, before any rank writes
    state, groups, _ = _state(models, optimizers)
    with _quiet():
        dcp.save(state, checkpoint_id=str(partial))
    save_atomic({"rng": rng, "param_groups": groups, "schedulers": [s.state_dict() for s in schedulers],
                 "scalers": [s.state_dict() for s in scalers]}, partial / f"rank-{rank}.pt")
    if rank == 0:
        save_atomic({"ptdash": {"step": step, "created": time.time(), "sharded": True,
                                "models": model_names(models), **meta}}, partial / META)
    barrier()  # every rank has written
    size = 0
    if rank == 0:
        for path in partial.iterdir():
            perms.secure(path)
            _fsync(path)
            size += path.stat().st_size
        if final.exists():  # saved at this step already (a checkpoint, then a stop)
            shutil.rmtree(final)
        os.replace(partial, final)
        _fsync(directory)
    return final, size


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_meta(path: Path) -> dict:
    """A sharded checkpoint's ``ptdash.pt``: ``{"ptdash": {...}}``."""
    return torch.load(Path(path) / META, map_location="cpu", weights_only=True)


def load(path: Path, models: list, optimizers: list, schedulers: list, scalers: list) -> tuple[list, list, dict]:
    """Load ``path`` into the live objects (every rank, at the same point); what was restored,
    warnings and this rank's saved RNG states. Raises what DCP raises for a checkpoint that
    does not fit."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    path = Path(path)
    state, _, owners = _state(models, optimizers)
    try:
        with _quiet():
            dcp.load(state, checkpoint_id=str(path))
    except CheckpointException as exc:  # a BaseException, with every rank's traceback: its last line
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        raise RuntimeError(lines[-1] if lines else type(exc).__name__) from None
    mine = path / f"rank-{_rank()}.pt"
    warnings = []
    if not mine.is_file():  # a run with more ranks than the saved one: rank 0's schedules
        warnings.append(f"no {mine.name} in the checkpoint (saved by fewer ranks): rank 0's RNG and schedules")
        mine = path / "rank-0.pt"
    own = torch.load(mine, map_location="cpu", weights_only=True)
    restored = []
    for name, model in zip(model_names(models), models):
        with _quiet():
            set_model_state_dict(model, state["models"][name])
        restored.append(f"model {name}")
    for i, (opt, owner) in enumerate(zip(optimizers, owners)):
        if str(i) in state["optimizers"]:
            osd = {"state": state["optimizers"][str(i)], "param_groups": own["param_groups"][str(i)]}
            with _optimizers_unhooked(), _quiet():
                set_optimizer_state_dict(owner, opt, osd)
            restored.append(f"optimizer {type(opt).__name__}")
    for kind, live in (("schedulers", schedulers), ("scalers", scalers)):
        saved = own.get(kind, [])
        if len(saved) != len(live):
            warnings.append(f"checkpoint has {len(saved)} {kind}, the script made {len(live)}")
        for obj, s in zip(live, saved):
            obj.load_state_dict(s)
            restored.append(f"{kind[:-1]} {type(obj).__name__}")
    restored.append("the RNG states")
    return restored, warnings, own["rng"]
