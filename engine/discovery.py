"""Finding what the script made, with no code change: its optimizers, LR schedulers,
GradScalers and models, and the names of their parameters.

The registries are filled by patches on the classes' ``__init__`` (optimizers, LR
schedulers and GradScalers; a copy made by unpickling is not registered) and by
``ptdash.watch``; they hold weak
references, so ptdash never keeps a script's object alive. Models are the outermost
modules owning the optimizers' parameters, found once by a scan of the garbage
collector's objects (global forward hooks would cost microseconds per module call and
force torch.compile to recompile when removed).
"""

from __future__ import annotations

import gc
import weakref
from typing import Any, Callable

import torch
from torch import nn

from .invisible import own
from .patching import Patches


class Discovery:
    """The registries of the script's training objects, and the models for checkpoints."""

    def __init__(self) -> None:
        self.optimizers: list[weakref.ref] = []
        self.schedulers: list[weakref.ref] = []
        self.scalers: list[weakref.ref] = []
        self.models: list[nn.Module] = []
        """The models checkpoints save and layer names come from (outermost, possibly wrapped)."""
        self.on_models: list[Callable[[list[nn.Module]], None]] = []
        """Called with the new list whenever the models change."""

    def attach(self, patches: Patches) -> None:
        """Register every optimizer, scheduler and scaler the script creates from now on."""
        _register_on_init(patches, torch.optim.Optimizer, self.optimizers)
        sched = torch.optim.lr_scheduler
        # ReduceLROnPlateau, SequentialLR and ChainedScheduler do not call LRScheduler.__init__.
        for cls in (sched.LRScheduler, sched.ReduceLROnPlateau, sched.SequentialLR, sched.ChainedScheduler):
            _register_on_init(patches, cls, self.schedulers)
        _register_on_init(patches, torch.amp.GradScaler, self.scalers)

    @staticmethod
    def live(registry: list[weakref.ref]) -> list:
        """The objects of a registry that still exist, in creation order."""
        return [o for o in (r() for r in registry) if o is not None]

    def add(self, registry: list[weakref.ref], obj: Any) -> None:
        if not any(r() is obj for r in registry):
            registry.append(weakref.ref(obj))

    def top_schedulers(self) -> list:
        """Schedulers not owned by a composite one (SequentialLR, ChainedScheduler)."""
        scheds = self.live(self.schedulers)
        children = {id(c) for s in scheds for c in getattr(s, "_schedulers", [])}
        return [s for s in scheds if id(s) not in children]

    def total_steps(self) -> int | None:
        """The step the run ends at, when a scheduler knows it (OneCycleLR)."""
        for sched in self.live(self.schedulers):
            total = getattr(sched, "total_steps", None)
            if isinstance(total, int) and not isinstance(total, bool):
                return total
        return None

    def set_models(self, models: list[nn.Module]) -> None:
        self.models = list(models)
        for listener in self.on_models:
            listener(self.models)

    def ensure_models(self) -> list[nn.Module]:
        """The models, found from the live optimizers if none is known yet."""
        if not self.models:
            optimizers = self.live(self.optimizers)
            if optimizers:
                self.set_models(find_models(optimizers))
        return self.models

    def watch(self, model=None, optimizer=None, scheduler=None, scaler=None) -> None:
        """``ptdash.watch``: name the objects instead of discovering them."""
        if model is not None:
            self.set_models(_as_list(model))
        for objs, registry in ((optimizer, self.optimizers), (scheduler, self.schedulers), (scaler, self.scalers)):
            for obj in _as_list(objs):
                self.add(registry, obj)


def _as_list(x) -> list:
    return [] if x is None else list(x) if isinstance(x, (list, tuple)) else [x]


def _register_on_init(patches: Patches, cls: type, registry: list) -> None:
    """Register each object ``cls.__init__`` makes (a copy made by unpickling is not one)."""
    original = cls.__init__

    @own
    def __init__(obj, *args, **kwargs):
        original(obj, *args, **kwargs)
        if not any(r() is obj for r in registry):
            registry.append(weakref.ref(obj))

    __init__.__wrapped__ = original
    patches.set(cls, "__init__", __init__)


# ------------------------------------------------------------------------- models


def find_models(optimizers: list[torch.optim.Optimizer]) -> list[nn.Module]:
    """The outermost modules owning the optimizers' parameters.

    One pass over the garbage collector's objects (tens of milliseconds, once).
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


def param_names(models: list[nn.Module], params: list[torch.Tensor]) -> list[str]:
    """The name each parameter has in its model (``blocks.0.attn.weight``); ``param<i>``
    for one no model owns. The one naming the Layers tab, the doctor and anomalies use."""
    by_id: dict[int, str] = {}
    for model in models:
        for name, p in unwrap(model).named_parameters():
            by_id.setdefault(id(p), name)
    return [by_id.get(id(p), f"param{i}") for i, p in enumerate(params)]
