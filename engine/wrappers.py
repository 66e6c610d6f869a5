"""The torch functions ptdash wraps: what each keeps for the step, and the live clip.

- ``torch.autograd.backward``: the loss, kept as a detached device scalar;
- ``GradScaler.scale``: the unscaled loss of a scaled one, found again at its backward;
- ``Optimizer.zero_grad``: what a step GradScaler skipped left behind is dropped;
- ``clip_grad_norm_`` / ``clip_grads_with_norm_``: the live clip value overrides the
  script's, and the pre-clip norm (the same tensor the script computes) is kept.

Each wrapper reads and writes the per-step state of a ``hooks.Hooks``.
"""

from __future__ import annotations

import weakref

import torch

from . import metrics


def wrap_backward(hooks, original):
    """``torch.autograd.backward`` that keeps the loss: a detached reference, no copy."""
    doctor, Tensor = hooks.doctor, torch.Tensor

    def backward(tensors, *args, **kwargs):
        t = tensors
        if not isinstance(t, Tensor):
            t = t[0] if isinstance(t, (list, tuple)) and len(t) == 1 else None
        if isinstance(t, Tensor) and t.numel() == 1:
            if hooks._unscaled:
                ref, raw = hooks._unscaled.pop(id(t), (None, None))
                if ref is not None and ref() is t:
                    t = raw
            hooks._losses.append(t.detach())
        if doctor.watching:
            doctor.on_backward()
        return original(tensors, *args, **kwargs)

    backward.__wrapped__ = original
    return backward

def wrap_scale(hooks, original):
    """``GradScaler.scale`` that remembers the loss before scaling, for the loss chart."""

    def scale(scaler, outputs):
        scaled = original(scaler, outputs)
        if isinstance(outputs, torch.Tensor) and isinstance(scaled, torch.Tensor) and outputs.numel() == 1:
            # The loss before scaling, for the loss chart, found again at its backward.
            if len(hooks._unscaled) > 64:  # scaled losses that never ran backward
                hooks._unscaled.clear()
            hooks._unscaled[id(scaled)] = (weakref.ref(scaled), outputs.detach())
        return scaled

    scale.__wrapped__ = original
    return scale

def wrap_zero_grad(hooks, original):
    """``Optimizer.zero_grad``: drops what a skipped step left, and tells the doctor."""
    doctor = hooks.doctor

    def zero_grad(opt, *args, **kwargs):
        if not hooks._in_step and (hooks.main is None or hooks.main() is opt):
            # What a step GradScaler skipped left behind (no optimizer hook fired)
            # must not be counted in the next step.
            if hooks._losses:
                hooks._losses = []
            hooks._norms = None
            hooks._clip_max = None
        if doctor.watching:
            doctor.on_zero_grad(opt)
        return original(opt, *args, **kwargs)

    zero_grad.__wrapped__ = original
    return zero_grad

def wrap_clip(hooks, original):
    """``clip_grad_norm_`` with the live clip override, measuring the norms once for both."""

    @torch.no_grad()
    def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None):
        params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        override = hooks.settings.clip
        effective = float(max_norm) if override is None else override
        if error_if_nonfinite:
            # Rare; keep torch's own error path exactly.
            total = original(params, effective, norm_type, error_if_nonfinite, foreach)
            hooks._note_clip(total, None, params, effective)
            return total
        with_grad = [p for p in params if p.grad is not None]
        per_tensor, total = metrics.grad_norms([p.grad for p in with_grad], norm_type, foreach)
        metrics.clip_with_norm(params, effective, total, foreach)
        hooks._note_clip(total, per_tensor, with_grad, effective)
        return total

    clip_grad_norm_.__wrapped__ = original
    return clip_grad_norm_

def wrap_clip_with_norm(hooks, original):
    """``clip_grads_with_norm_`` (the two-step API) with the live clip override."""

    def clip_grads_with_norm_(parameters, max_norm, total_norm, foreach=None):
        override = hooks.settings.clip
        effective = float(max_norm) if override is None else override
        hooks._note_clip(total_norm, None, None, effective)
        return original(parameters, effective, total_norm, foreach)

    clip_grads_with_norm_.__wrapped__ = original
    return clip_grads_with_norm_
