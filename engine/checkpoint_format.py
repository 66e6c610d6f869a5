"""The checkpoint's format: what it holds, made from the script's objects and put back into them.

A checkpoint is a plain dict (loadable with ``torch.load(path, weights_only=True)``):

```
{"ptdash": {"version", "step", "run_id", "created", "controls", "journal"},
 "models": {name: state_dict}, "optimizers": [state_dict], "schedulers": [state_dict],
 "scalers": [state_dict], "rng": {"python", "numpy", "torch", "cuda"}}
```

``build`` makes it, ``load`` reads one (one line for any problem), ``apply`` puts it into
the live objects after checking that every model fits; ``rng_state``/``set_rng_state`` are
every RNG's state as plain lists and tensors (snapshot.py's rollback uses them too).
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import torch

from .discovery import model_names, unwrap

FORMAT_VERSION = 1


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be read or applied; the message is one line for the user."""


class ResumeError(SystemExit):
    """A ``--resume`` checkpoint that does not fit the script's objects, found before its
    first step: the run ends there, crashed, with this one line (exit status 2).

    A SystemExit, so the script's ``except Exception`` does not swallow it; its
    ``finally`` blocks run.
    """

    def __init__(self, message: str) -> None:
        super().__init__(2)
        self.message = message

    def __str__(self) -> str:
        return self.message


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


def apply(ckpt: dict, models, optimizers, schedulers, scalers) -> tuple[list[str], list[str]]:
    """Load the checkpoint's states into the live objects; return what was restored and
    warnings for what does not pair up. Raises CheckpointError, before changing anything,
    when a model's parameter names or shapes differ from the checkpoint's, and when a
    state is refused."""
    restored, warnings = [], []
    saved_models = ckpt.get("models", {})
    names = model_names(models)
    if len(models) == 1 and len(saved_models) == 1 and names[0] not in saved_models:
        # One model each, of another class name (renamed, or wrapped): its parameters decide.
        (saved_name,) = saved_models
        warnings.append(f"model {names[0]} loaded from the checkpoint's {saved_name}")
        saved_models = {names[0]: saved_models[saved_name]}
    for name, model in zip(names, models):
        if name not in saved_models:
            raise CheckpointError(f"it has no state for the script's model {name} "
                                  f"(it holds {', '.join(saved_models) or 'no model'})")
        problem = misfit(saved_models[name], unwrap(model).state_dict())
        if problem:
            raise CheckpointError(f"it does not fit the script's model {name}: {problem}")
    for name, model in zip(names, models):
        _load(f"model {name}", unwrap(model), saved_models[name])
        restored.append(f"model {name}")
    for kind, live in (("optimizers", optimizers), ("schedulers", schedulers), ("scalers", scalers)):
        saved = ckpt.get(kind, [])
        if len(saved) != len(live):
            warnings.append(f"checkpoint has {len(saved)} {kind}, the script made {len(live)}")
        for obj, state in zip(live, saved):
            _load(kind[:-1], obj, state)
            restored.append(f"{kind[:-1]} {type(obj).__name__}")
    if "rng" in ckpt:
        set_rng_state(ckpt["rng"])
        restored.append("the RNG states")
    return restored, warnings


def misfit(saved: dict, live: dict) -> str | None:
    """How a saved state dict differs from a live one in names and shapes, in one line, or None."""
    def listed(names: list[str]) -> str:
        return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")

    def shape(value) -> str:
        return "x".join(map(str, value.shape)) or "a scalar"

    missing = [k for k in live if k not in saved]
    unexpected = [k for k in saved if k not in live]
    resized = [f"{k} is {shape(saved[k])} in the checkpoint, {shape(live[k])} in the model" for k in live
               if k in saved and hasattr(saved[k], "shape") and hasattr(live[k], "shape")
               and tuple(saved[k].shape) != tuple(live[k].shape)]
    parts = ([f"{len(missing)} missing ({listed(missing)})"] if missing else []) + \
            ([f"{len(unexpected)} unexpected ({listed(unexpected)})"] if unexpected else []) + resized[:2] + \
            ([f"{len(resized) - 2} more of other shapes"] if len(resized) > 2 else [])
    return "; ".join(parts) or None


def _load(what: str, obj, state) -> None:
    try:
        obj.load_state_dict(state)
    except Exception as exc:  # torch's messages run to many lines: keep the first
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"its {what} state does not fit the script's: {first}") from None
