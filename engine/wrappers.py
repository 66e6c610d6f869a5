"""The torch functions ptdash wraps: what each keeps for the step, and the live clip.

- ``torch.autograd.backward``: the loss, kept as a detached device scalar; with no
  optimizer, the inferred step boundary and the step's norms (manual.py);
- ``GradScaler.scale``: the unscaled loss of a scaled one, found again at its backward;
- ``Optimizer.zero_grad``: what a step GradScaler skipped left behind is dropped;
- ``clip_grad_norm_`` / ``clip_grads_with_norm_`` / FSDP1's ``clip_grad_norm_`` method: the main optimizer's clip is the
  step's boundary (commands first, so a new clip value is the one this step uses); the
  live clip value overrides the script's, and the pre-clip norm is kept;
- an ``optimizer.step(closure)``'s closure: timed, and clipped after each evaluation.

Each wrapper reads and writes the per-step state the step boundary's parts share
(``hooks.Hooks.state``, stepstate.py); each is marked ``own`` so warnings and tracebacks
skip its frame.
"""

from __future__ import annotations

import math
import time
import weakref

import torch

from . import metrics, sharded
from .invisible import own
from .sharded import is_dtensor

_perf_counter = time.perf_counter
_isfinite = math.isfinite
_FLOAT64 = torch.float64
MAX_LOSSES = 64
"""Loss references kept for one step; beyond this they are added up on the device."""


def _keep(state, loss: torch.Tensor) -> None:
    """Keep a detached reference to the step's loss (no copy)."""
    losses = state.losses
    losses.append(loss.detach())
    if len(losses) > MAX_LOSSES:  # beyond this they are added up on the device
        state.losses = [metrics.fold(losses)]


def wrap_backward(hooks, original):
    """``torch.autograd.backward`` that keeps the loss: a detached reference, no copy; on
    the lean path (a step the budget does not sample), a CPU loss is read at once instead."""
    doctor, manual, state, Tensor = hooks.doctor, hooks.manual, hooks.state, torch.Tensor
    pre, optimizers, infer = hooks.pre, hooks.optimizers, hooks.inferred

    @own
    def backward(tensors, *args, **kwargs):
        t_in = _perf_counter()
        t = tensors
        if not isinstance(t, Tensor):
            t = t[0] if isinstance(t, (list, tuple)) and len(t) == 1 else None
        loss = t if isinstance(t, Tensor) and t.numel() == 1 else None
        if state.lean and not state.unscaled:
            # The next step may take the lean path (stepend.py): a known optimizer, nothing
            # watched or sampled, so nothing else here applies. A CPU loss is read now: no
            # reference is kept and its pre-update check is done (a non-finite one sends the
            # step down the full path, whose check stops it). Each tensor call costs
            # microseconds when caches are cold, as they are once a step: this makes one.
            if loss is not None:
                if not state.losses and loss.is_cpu and loss.dtype is not _FLOAT64:
                    value = loss.item()
                    state.losses.append(value)
                    if not _isfinite(value) or value > state.loss_max:  # checked, or judged, before the update
                        state.lean = {}
                        pre.put_back()
                else:
                    _keep(state, loss)
                    if state.pre_off and loss.is_cpu:
                        pre.put_back()  # the pre-step hook checks it before the update
            state.own += _perf_counter() - t_in
            return original(tensors, *args, **kwargs)
        if state.pre_off:
            pre.put_back()
        if state.t_post is None:
            state.began()
        inferred = optimizers.main is None and infer.optimizer_less()
        if inferred and loss is not None and loss.grad_fn is not None:
            # No optimizer exists: perhaps the script updates its parameters itself.
            first = manual.params is None
            if manual.starts_step(loss):
                # The step's record counts ptdash's time so far, and times its own end (a
                # pause or a save at the boundary is not ptdash's): the clock restarts after.
                state.own += _perf_counter() - t_in
                infer.manual_boundary()
                t_in = _perf_counter()
            elif first and manual.params:
                manual.order(manual.models())
        if loss is not None:
            if state.unscaled:
                ref, raw = state.unscaled.pop(id(loss), (None, None))
                if ref is not None and ref() is loss:
                    loss = raw
            _keep(state, loss)
        if doctor.watching:
            doctor.on_backward()
        state.own += _perf_counter() - t_in
        result = original(tensors, *args, **kwargs)
        if optimizers.main is None:
            if inferred and manual.params:
                infer.after_manual_backward()
            infer.note_backward_without_step()
        return result

    backward.__wrapped__ = original
    return backward


def wrap_scale(hooks, original):
    """``GradScaler.scale`` that remembers the loss before scaling, for the loss chart."""
    state = hooks.state

    @own
    def scale(scaler, outputs):
        scaled = original(scaler, outputs)
        if isinstance(outputs, torch.Tensor) and isinstance(scaled, torch.Tensor) and outputs.numel() == 1:
            if len(state.unscaled) > 64:  # scaled losses that never ran backward
                state.unscaled.clear()
            state.unscaled[id(scaled)] = (weakref.ref(scaled), outputs.detach())
        return scaled

    scale.__wrapped__ = original
    return scale


def wrap_zero_grad(hooks, original):
    """``Optimizer.zero_grad``: drops what a skipped step left, and tells the doctor."""
    doctor, state, optimizers = hooks.doctor, hooks.state, hooks.optimizers

    @own
    def zero_grad(opt, *args, **kwargs):
        t_in = _perf_counter()
        if state.losses or state.clip_notes.notes:
            main = optimizers.main
            if not state.in_step and (main is None or main.ref() is opt):
                # What a skipped step left behind (GradScaler's, or the script's own: no
                # optimizer hook fired) must not be counted in the next step.
                state.losses = []
                state.clip_notes.clear()
        if doctor.watching:
            doctor.on_zero_grad(opt)
        state.own += _perf_counter() - t_in
        return original(opt, *args, **kwargs)

    zero_grad.__wrapped__ = original
    return zero_grad


def _at_clip(state, pre, optimizers, params: list) -> None:
    """A clip call of the main optimizer's parameters is its step's boundary."""
    if state.pre_off:
        pre.put_back()  # a clip's norms are recorded by the pre-step hook
    main = optimizers.main
    if main is not None and not state.at_boundary and main.owns(params):
        pre.boundary()


def wrap_clip(hooks, original):
    """``clip_grad_norm_`` with the live clip override, measuring the norms once for both."""
    state, pre, optimizers, settings = hooks.state, hooks.pre, hooks.optimizers, hooks.settings

    @torch.no_grad()
    @own
    def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None):
        params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        _at_clip(state, pre, optimizers, params)
        override = settings.clip
        effective = float(max_norm) if override is None else override
        if error_if_nonfinite:
            # Rare; keep torch's own error path exactly.
            total = original(params, effective, norm_type, error_if_nonfinite, foreach)
            state.clip_notes.add(params, None, sharded.full_total(total), effective)
            return total
        with_grad = [p for p in params if p.grad is not None]
        per_tensor, total = metrics.grad_norms([p.grad for p in with_grad], norm_type, foreach)
        metrics.clip_with_norm(params, effective, total, foreach)
        if is_dtensor(total):
            # Shards (FSDP2): the total is the whole model's, reduced as torch's own clip
            # reduces it (here, where every rank is); the per-parameter norms are the
            # local shards' (sharded.py). The script gets torch's DTensor.
            state.clip_notes.add(with_grad, sharded.local([per_tensor])[0], sharded.full_total(total), effective)
        else:
            state.clip_notes.add(with_grad, per_tensor, total, effective)
        return total

    clip_grad_norm_.__wrapped__ = original
    return clip_grad_norm_


def wrap_fsdp_clip(hooks, original):
    """``FullyShardedDataParallel.clip_grad_norm_`` (FSDP1's own, which reduces its shards'
    norms across ranks) with the live clip override; its total is kept for the step."""
    state, pre, optimizers, settings = hooks.state, hooks.pre, hooks.optimizers, hooks.settings

    @own
    def clip_grad_norm_(module, max_norm, norm_type=2.0):
        first = next(iter(module.parameters()), None)
        params = [first] if first is not None else []  # whose optimizer it is: the first tells
        _at_clip(state, pre, optimizers, params)
        override = settings.clip
        effective = float(max_norm) if override is None else override
        total = original(module, effective, norm_type)
        state.clip_notes.add(params, None, total, effective)
        return total

    clip_grad_norm_.__wrapped__ = original
    return clip_grad_norm_


def wrap_clip_with_norm(hooks, original):
    """``clip_grads_with_norm_`` (the two-step API) with the live clip override."""
    state, pre, optimizers, settings = hooks.state, hooks.pre, hooks.optimizers, hooks.settings

    @own
    def clip_grads_with_norm_(parameters, max_norm, total_norm, foreach=None):
        params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        _at_clip(state, pre, optimizers, params)
        override = settings.clip
        effective = float(max_norm) if override is None else override
        state.clip_notes.add(params, None, total_norm, effective)
        return original(params, effective, total_norm, foreach)

    clip_grads_with_norm_.__wrapped__ = original
    return clip_grads_with_norm_


def wrap_closure(state, grads_ready, tracked, closure):
    """The closure of ``optimizer.step(closure)``, timed; clipped after every evaluation
    (LBFGS evaluates it several times per step), its first evaluation measured
    (``grads_ready``, prestep.py)."""
    calls = 0

    @own
    def ptdash_closure():
        nonlocal calls
        t0 = _perf_counter()
        loss = closure()
        if tracked.index == 0:
            state.inner += _perf_counter() - t0
        calls += 1
        t1 = _perf_counter()
        grads_ready(tracked, measure=calls == 1)
        state.own += _perf_counter() - t1
        return loss

    return ptdash_closure
