"""Checkpoints with no code change: find the state, save it atomically, load it back.

A checkpoint is a plain dict (loadable with ``torch.load(path, weights_only=True)``):

```
{"ptdash": {"version", "step", "run_id", "created", "controls", "journal"},
 "models": {name: state_dict}, "optimizers": [state_dict], "schedulers": [state_dict],
 "scalers": [state_dict], "rng": {"python", "numpy", "torch", "cuda"}}
```
"""

from __future__ import annotations

import gc
import os
import random
import re
import time
from pathlib import Path

import torch
from torch import nn

FORMAT_VERSION = 1


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be read or applied; the message is one line for the user."""


# ------------------------------------------------------------------------- discovery


def find_models(optimizers: list[torch.optim.Optimizer]) -> list[nn.Module]:
    """The outermost modules owning the optimizers' parameters.

    One pass over the garbage collector's objects at the first optimizer step (tens of
    milliseconds, once) instead of global forward hooks, which cost microseconds on every
    module call and force torch.compile to recompile when removed.
    """
    wanted = {id(p) for opt in optimizers for g in opt.param_groups for p in g["params"]}
    if not wanted:
        return []
    # type() rather than isinstance(): some proxies warn when asked for __class__.
    modules = [o for o in gc.get_objects() if issubclass(type(o), nn.Module) and "_modules" in o.__dict__]
    parents: dict[int, list[nn.Module]] = {}
    for m in modules:
        for child in m._modules.values():
            if child is not None:
                parents.setdefault(id(child), []).append(m)
    roots: dict[int, nn.Module] = {}
    stack = [m for m in modules if any(p is not None and id(p) in wanted for p in m._parameters.values())]
    seen: set[int] = set()
    while stack:
        m = stack.pop()
        if id(m) in seen:
            continue
        seen.add(id(m))
        ups = parents.get(id(m))
        if ups:
            stack.extend(ups)
        else:
            # A wrapper (DDP, torch.compile) holds the model as a child, so it is the root.
            roots[id(m)] = m
    return list(roots.values())


def unwrap(model: nn.Module) -> nn.Module:
    """The user's model inside DistributedDataParallel / DataParallel / torch.compile."""
    while True:
        if hasattr(model, "_orig_mod") and isinstance(model._orig_mod, nn.Module):
            model = model._orig_mod
        elif isinstance(getattr(model, "module", None), nn.Module) and type(model).__name__ in (
                "DistributedDataParallel", "DataParallel"):
            model = model.module
        else:
            return model


def model_names(models: list[nn.Module]) -> list[str]:
    """Stable, distinct names for the models: their class names, numbered on clashes."""
    names, seen = [], {}
    for m in models:
        base = type(unwrap(m)).__name__
        seen[base] = seen.get(base, 0) + 1
        names.append(base if seen[base] == 1 else f"{base}{seen[base]}")
    return names


# ------------------------------------------------------------------------------- rng


def rng_state() -> dict:
    """Every RNG state as plain lists and tensors (no pickled objects)."""
    version, state, gauss = random.getstate()
    out = {"python": [version, list(state), gauss], "torch": torch.get_rng_state()}
    np = _numpy()
    if np is not None:
        kind, keys, pos, has_gauss, cached = np.random.get_state()
        out["numpy"] = [kind, torch.from_numpy(keys.astype("int64")), int(pos), int(has_gauss), float(cached)]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def set_rng_state(state: dict) -> None:
    version, values, gauss = state["python"]
    random.setstate((version, tuple(values), gauss))
    torch.set_rng_state(state["torch"])
    np = _numpy()
    if np is not None and "numpy" in state:
        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((kind, keys.numpy().astype("uint32"), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _numpy():
    # Only if the script already imported numpy: importing it ourselves costs time and
    # its RNG state would be meaningless.
    import sys

    return sys.modules.get("numpy")


# ------------------------------------------------------------------------ save / load


def build(step: int, models, optimizers, schedulers, scalers, meta: dict) -> dict:
    """The checkpoint dict for the current state of the training objects."""
    names = model_names(models)
    return {
        "ptdash": {"version": FORMAT_VERSION, "step": step, "created": time.time(), **meta},
        "models": {n: unwrap(m).state_dict() for n, m in zip(names, models)},
        "optimizers": [o.state_dict() for o in optimizers],
        "schedulers": [s.state_dict() for s in schedulers],
        "scalers": [s.state_dict() for s in scalers],
        "rng": rng_state(),
    }


def save_atomic(obj: dict, path: Path) -> int:
    """Write ``obj`` to ``path`` so that a crash leaves the old file or the new one, never
    half of one: temp file in the same directory, fsync, rename, fsync the directory.

    Returns the file's size in bytes.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
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


def load(path: Path) -> dict:
    """Read a ptdash checkpoint; raise CheckpointError with one line on any problem."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a damaged file
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"checkpoint {path} is unreadable: {first}") from None
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("ptdash"), dict) or "step" not in ckpt["ptdash"]:
        raise CheckpointError(f"{path} is not a ptdash checkpoint")
    return ckpt


def apply(ckpt: dict, models, optimizers, schedulers, scalers) -> list[str]:
    """Load the checkpoint's states into the live objects; return warnings for mismatches."""
    warnings = []
    saved_models = ckpt.get("models", {})
    for name, model in zip(model_names(models), models):
        if name in saved_models:
            unwrap(model).load_state_dict(saved_models[name])
        else:
            warnings.append(f"no saved state for model {name}")
    for kind, live in (("optimizers", optimizers), ("schedulers", schedulers), ("scalers", scalers)):
        saved = ckpt.get(kind, [])
        if len(saved) != len(live):
            warnings.append(f"checkpoint has {len(saved)} {kind}, the script made {len(live)}")
        for obj, state in zip(live, saved):
            obj.load_state_dict(state)
    if "rng" in ckpt:
        set_rng_state(ckpt["rng"])
    return warnings


_STEP_FILE = re.compile(r"^step-(\d+)\.pt$")


def prune(directory: Path, keep_last: int) -> list[Path]:
    """Delete all but the newest ``keep_last`` step-N.pt files; return what was removed."""
    found = sorted(
        (int(m.group(1)), p) for p in directory.glob("step-*.pt") if (m := _STEP_FILE.match(p.name))
    )
    removed = [p for _, p in found[:-keep_last]] if keep_last > 0 else []
    for p in removed:
        p.unlink(missing_ok=True)
    return removed
