"""The optimizers that step: which is the main one (whose steps are counted), and each one's
bookkeeping for the hot path: its parameters, this step's norms and clip, and the LR factor
applied around its update."""

from __future__ import annotations

import functools
import operator
import weakref

import torch

from . import metrics, sharded
from .discovery import find_models, model_names
from .shared import events, names

_GRAD = operator.attrgetter("grad")
_IS_SET = functools.partial(operator.is_not, None)

HANDOVER_STEPS = 5
"""Steps in a row of another optimizer, with no step of the main one between, that make it
the main one (``Optimizers.hand_over``): its step after the main one's last, and four
more. A GAN's discriminator whose GradScaler skips up to three steps in a row (overflows)
stays the main one."""


class Tracked:
    """An optimizer that has stepped; ``index`` 0 is the main one, then in order of first step."""

    def __init__(self, opt: torch.optim.Optimizer, index: int) -> None:
        self.ref = weakref.ref(opt)
        self.index = index
        self._params_of = -1
        """The number of param groups ``_params`` was flattened from."""
        self._params: list[torch.Tensor] = []
        self._ids: frozenset[int] = frozenset()
        self._fused: bool | None = None
        """Whether its gradients take the fused norm path (one device, one dtype, foreach
        support); decided once per parameter list."""
        self.sharded: bool | None = None
        """Whether its parameters are shards (FSDP, sharded.py): their norms are the local
        shards' unless reduced across ranks; decided once per parameter list."""
        self.norms: tuple | None = None
        """(per-parameter norms, total norm, parameters) of this step, before its update."""
        self.local = False
        """Whether this step's total in ``norms`` is of this rank's shards only (``grad/norm_local``)."""
        self.clip_max: float | None = None
        """The clipping norm this step's gradients were clipped at, or None."""
        self.closure_losses: int | None = None
        """With a closure, where its losses start in the step's list; None without one."""
        self.stepped_at = -1
        """Another optimizer's: the main step count at its latest step."""
        self.alone = 0
        """Another optimizer's: its steps in a row at that count, with no main step between
        (HANDOVER_STEPS of them hand the main role over to it)."""
        self._saved_lrs: list[tuple[dict, object]] = []

    def stepped_alone(self, count: int) -> int:
        """Another optimizer stepped at main step count ``count``: its steps in a row there."""
        self.alone = self.alone + 1 if self.stepped_at == count else 1
        self.stepped_at = count
        return self.alone

    def params(self) -> list[torch.Tensor]:
        opt = self.ref()
        if len(opt.param_groups) != self._params_of:
            # Rebuilt when ``add_param_group`` added a group.
            self._params_of = len(opt.param_groups)
            self._params = [p for g in opt.param_groups for p in g["params"]]
            self._ids = frozenset(map(id, self._params))
            self._fused = None
            self.sharded = sharded.is_sharded(self._params)
        return self._params

    def owns(self, params: list[torch.Tensor]) -> bool:
        """Whether ``params`` (a clip call's) are this optimizer's."""
        self.params()
        return bool(params) and id(params[0]) in self._ids

    def with_grad(self) -> list[torch.Tensor]:
        """The parameters that have a gradient."""
        return [p for p in self.params() if p.grad is not None]

    def measure(self) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
        """The parameters with a gradient, their per-parameter norms and the total norm."""
        params = self.params()
        # map and filter in C: no Python frame per parameter.
        grads = list(filter(_IS_SET, map(_GRAD, params)))
        if self.sharded:  # the local shards' norms: no collective (sharded.py)
            with_grad = params if len(grads) == len(params) else [p for p in params if p.grad is not None]
            return (with_grad, *metrics.grad_norms(sharded.local(grads)))
        if len(grads) != len(params):
            return ([p for p in params if p.grad is not None], *metrics.grad_norms(grads))
        if self._fused is None and grads:
            self._fused = metrics.fused_ok(grads)
        if self._fused:  # grad_norms's own fast path, without its per-step checks
            return (params, *metrics.fused_norms(grads))
        return (params, *metrics.grad_norms(grads))

    def measure_full(self) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
        """Of sharded parameters: the local shards' per-parameter norms and the whole model's
        total, reduced across ranks (a collective: only where every rank measures at the same
        step, under a live clip). DTensors reduce as ``clip_grad_norm_`` reduces them; FSDP1's
        flattened shards by an all-reduce of the squared local total over the default group."""
        params = [p for p in self.params() if p.grad is not None]
        grads = [p.grad for p in params]
        if grads and sharded.is_dtensor(grads[0]):
            per_tensor, total = metrics.grad_norms(grads)
            return params, sharded.local([per_tensor])[0], sharded.full_total(total)
        per_tensor, total = metrics.grad_norms(grads)
        return params, per_tensor, sharded.all_reduced_norm(total)

    def scale_lr(self, scale: float) -> None:
        for group in self.ref().param_groups:
            self._saved_lrs.append((group, group["lr"]))
            group["lr"] = group["lr"] * scale

    def restore_lr(self) -> list | None:
        """Put the scheduled LRs back after the update; the ones the update used, or None."""
        if not self._saved_lrs:
            return None
        effective = [group["lr"] for group, _ in self._saved_lrs]
        for group, lr in self._saved_lrs:
            group["lr"] = lr
        self._saved_lrs.clear()
        return effective


class Optimizers:
    """Every optimizer that stepped, by ``id``, and the main one.

    The first optimizer that steps is the main one (a GAN's discriminator, say); every other
    one's steps are recorded at the main step they follow, under ``opt<k>/...`` names (k in
    the order they first stepped). The ``journal`` is told when another one steps for the
    first time and when one takes the main role; the main one is added to ``discovery``'s
    optimizers, and ``manual`` (manual.py) stops inferring steps.
    """

    def __init__(self, state, discovery, manual, journal) -> None:
        self._state, self._discovery, self._manual, self._journal = state, discovery, manual, journal
        self.main: Tracked | None = None
        """The main optimizer's bookkeeping, or None before any optimizer stepped."""
        self.by_id: dict[int, Tracked] = {}
        """id(optimizer) -> its bookkeeping."""

    def track(self, opt) -> Tracked:
        """The bookkeeping of ``opt``, whose step begins (before its update); a new optimizer's
        is made here, and one that stepped HANDOVER_STEPS times in a row becomes the main one."""
        tracked = self.by_id.get(id(opt))
        if tracked is None or tracked.ref() is not opt:
            main = self.main.ref() if self.main is not None else None
            if main is None:
                # The first optimizer that steps is the main one (or the next, once it is gone).
                tracked = Tracked(opt, 0)
                self.main = tracked
                self._manual.active = False
                self._discovery.add(self._discovery.optimizers, opt)
            else:
                tracked = Tracked(opt, 1 + sum(t.index > 0 for t in self.by_id.values()))
                self._journal_new(tracked.index, opt)
            self.by_id[id(opt)] = tracked
            if tracked.params() and tracked.sharded and self._journal.rank == 0:
                self._journal.event("run", f"the parameters of optimizer {tracked.index} are shards (FSDP): its total "
                                    "gradient norm is the script's clip's (reduced across ranks); without one, each "
                                    "rank records its shards' norm (grad/norm_local), and per-layer norms are rank "
                                    "0's shards'")
        elif tracked.index and tracked.stepped_at == self._state.step and tracked.alone >= HANDOVER_STEPS - 1:
            self.hand_over(tracked)
        return tracked

    def hand_over(self, tracked: Tracked) -> None:
        """Another optimizer steps for the HANDOVER_STEPS-th time in a row with no main step
        between: the training has moved on to it (a network's Adam phase, then LBFGS, the first
        optimizer still referenced), so it is the main one from this step (the steps before
        it were kept at the main step they followed), and the old main takes its index."""
        old = self.main
        tracked.index, old.index = 0, tracked.index
        self.main = tracked
        self._state.lean = {}  # decided for the old roles
        opt = tracked.ref()
        self._discovery.add(self._discovery.optimizers, opt)
        was = type(old.ref()).__name__ if old.ref() is not None else "the first one"
        step = self._state.step + 1
        self._journal.event(events.Optimizer(index=0, cls=type(opt).__name__, main_from=step),
                            f"{type(opt).__name__} is the main optimizer from step {step}: "
                            f"it stepped {HANDOVER_STEPS} times with no step of {was} between "
                            f"(whose series are {names.of_optimizer(old.index, '...')} now)")

    def _journal_new(self, index: int, opt) -> None:
        """Another optimizer stepped: its series are opt<index>/..., named after its model."""
        models = model_names(find_models([opt]))
        self._journal.event(events.Optimizer(index=index, cls=type(opt).__name__, models=", ".join(models) or None),
                            f"optimizer {index} ({type(opt).__name__}) updates {', '.join(models) or 'no model'}: "
                            f"its series are {names.of_optimizer(index, '...')}")


class ClipNotes:
    """The script's clip calls of one step: ``(params, per_tensor, total, clip_max)`` each,
    taken by the optimizer whose parameters were clipped."""

    def __init__(self) -> None:
        self.notes: list[tuple] = []

    def add(self, params, per_tensor, total, clip_max: float) -> None:
        # A newer clip of the same parameters replaces one no step took (a step GradScaler skipped).
        first = params[0] if params else None
        if first is not None:
            self.notes = [n for n in self.notes if not n[0] or n[0][0] is not first]
        self.notes.append((params, per_tensor, total, clip_max))

    def keep_for(self, others: list[Tracked]) -> None:
        """At the main step's end: only the notes of other optimizers are kept, for their steps
        after it (an actor-critic clips both, then steps both)."""
        live = [t for t in others if t.ref() is not None]
        self.notes = [n for n in self.notes if n[0] is not None and any(t.owns(n[0]) for t in live)]

    def take(self, tracked: Tracked):
        for i, note in enumerate(self.notes):
            if note[0] is None or tracked.owns(note[0]):
                return self.notes.pop(i)
        return None

    def clear(self) -> None:
        self.notes.clear()

    def __bool__(self) -> bool:
        return bool(self.notes)
