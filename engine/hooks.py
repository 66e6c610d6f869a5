"""Every hook and patch ptdash puts into torch, and what they record per step.

All of it is public PyTorch API or a plain attribute swap, installed by ``attach()`` and
undone by ``detach()``:

- global optimizer step pre/post hooks: the step boundary (commands, pause, clipping,
  LR factor, gradient norms, step counting and timing);
- ``torch.autograd.backward``: the loss, kept as a detached device scalar;
- ``clip_grad_norm_`` / ``clip_grads_with_norm_``: the live clip value overrides the
  script's, and the pre-clip norm is seen;
- ``Optimizer.__init__``, ``LRScheduler.__new__``, ``GradScaler.__init__``/``scale``:
  discovery of what checkpoints need, and the unscaled loss under GradScaler;
- a forward pre-hook on the model once it is known, on the steps the doctor watches and
  whenever a checkpoint is due: time spent waiting for data, the batch size, and the save
  point at the start of a step.

The hot path is what runs at every step of the main optimizer: a loss reference kept at
``backward``, one fused norm pass (shared with the script's own clipping), a finite check
on CPU, and a tuple record appended for the flusher. Everything else is sampled.

Nothing here waits for the device: the only ``.item()`` calls read CPU tensors.
"""

from __future__ import annotations

import functools
import math
import operator
import time
import weakref
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from . import checkpoint, metrics
from .patching import Patches

_GRAD = operator.attrgetter("grad")
_LR = operator.itemgetter("lr")
_IS_SET = functools.partial(operator.is_not, None)
_perf_counter = time.perf_counter
_isfinite = math.isfinite
_FLOAT = {float}


class Hooks:
    """Installs the hooks and keeps the per-step bookkeeping for one process."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.step = 0
        """Completed steps of the main optimizer (the first one that stepped)."""
        self.main: weakref.ref | None = None
        self.optimizers: list[weakref.ref] = []
        self.schedulers: list[weakref.ref] = []
        self.scalers: list[weakref.ref] = []
        self.models: list[torch.nn.Module] = []
        self._handles: list[Any] = []
        self._patches = Patches()
        self._model_hook = None
        self._forward_on = True
        """Whether the model's forward pre-hook is wanted (it is installed once a model is known)."""
        # Per-step state, reset after each step of the main optimizer.
        self._losses: list[torch.Tensor] = []
        self._unscaled: dict[int, tuple[weakref.ref, torch.Tensor]] = {}
        """GradScaler-scaled losses waiting for their backward, and the loss before scaling."""
        self._norms: tuple[torch.Tensor | None, torch.Tensor] | None = None
        self._clip_max: float | None = None
        self._saved_lrs: list[tuple[dict, Any]] = []
        self._in_step = False
        self._closure_loss_index: int | None = None
        self._t_post = time.perf_counter()
        self._t_forward: float | None = None
        self._t_pre: float | None = None
        self._samples = 0
        self.layer_params: list[torch.Tensor] = []
        self._params_of: tuple = (None, 0)
        """The optimizer (and its number of param groups) that ``_params`` flattens."""
        self._params: list[torch.Tensor] = []
        self._fused: bool | None = None
        """Whether the main optimizer's gradients take the fused norm path (one device, one
        dtype, foreach support); decided once per parameter list."""
        self._before: list[torch.Tensor] | None = None
        self._before_params: list[torch.Tensor] | None = None
        self.update_ratio_every = 100
        self._resume = None
        self._resume_fire = None
        self._resume_handle = None
        self._dist_checked = False
        self._discovered = False
        self.last_step_s = 0.0
        """Recent step duration (a moving average), for spacing the rank exchanges."""
        self.grad_device = "cpu"
        """Where the gradients live: off the CPU, non-finite checks wait for the flush."""

    # ------------------------------------------------------------ attach / detach

    def attach(self) -> None:
        """Install every hook and patch."""
        self._handles += [
            register_optimizer_step_pre_hook(self._pre_step),
            register_optimizer_step_post_hook(self._post_step),
        ]
        self._patch(torch.autograd, "backward", self._wrap_backward(torch.autograd.backward))
        clip_module = torch.nn.utils.clip_grad
        clip = self._wrap_clip(clip_module.clip_grad_norm_)
        self._patch(clip_module, "clip_grad_norm_", clip)
        self._patch(torch.nn.utils, "clip_grad_norm_", clip)
        if hasattr(torch.nn.utils, "clip_grads_with_norm_"):
            with_norm = self._wrap_clip_with_norm(torch.nn.utils.clip_grads_with_norm_)
            self._patch(torch.nn.utils, "clip_grads_with_norm_", with_norm)
            if hasattr(clip_module, "clip_grads_with_norm_"):
                self._patch(clip_module, "clip_grads_with_norm_", with_norm)
        self._patch_init(torch.optim.Optimizer, self.optimizers)
        self._patch_new(torch.optim.lr_scheduler.LRScheduler, self.schedulers)
        self._patch_init(torch.amp.GradScaler, self.scalers)
        self._patch(torch.amp.GradScaler, "scale", self._wrap_scale(torch.amp.GradScaler.scale))
        self._patch(torch.optim.Optimizer, "zero_grad", self._wrap_zero_grad(torch.optim.Optimizer.zero_grad))
        if self._forward_on:  # attached again after a detach
            self._set_forward_hook(True)

    def arm_resume(self, apply) -> None:
        """Call ``apply()`` once, at the first module forward or optimizer step.

        The first forward is the latest moment at which loading weights still changes the
        first step's gradients; a global hook costs microseconds per module call, so it
        removes itself as soon as it has fired.
        """
        def fire(*_):
            if self._resume is not None:
                self._resume, pending = None, self._resume
                pending()
            if self._resume_handle is not None:
                self._resume_handle.remove()
                self._resume_handle = None

        self._resume = apply
        self._resume_fire = fire
        self._resume_handle = torch.nn.modules.module.register_module_forward_pre_hook(fire)

    def detach(self) -> None:
        """Undo everything ``attach`` did, newest first."""
        if self._resume_handle is not None:
            self._resume_handle.remove()
            self._resume_handle = None
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self._model_hook is not None:
            self._model_hook.remove()
            self._model_hook = None
        self._patches.undo()

    def _patch(self, owner: Any, name: str, replacement: Any) -> None:
        self._patches.set(owner, name, replacement)

    def _patch_init(self, cls: type, registry: list) -> None:
        original = cls.__init__

        def __init__(obj, *args, **kwargs):
            original(obj, *args, **kwargs)
            if not any(r() is obj for r in registry):
                registry.append(weakref.ref(obj))

        self._patch(cls, "__init__", __init__)

    def _patch_new(self, cls: type, registry: list) -> None:
        # __new__ rather than __init__: ReduceLROnPlateau, SequentialLR and ChainedScheduler
        # do not call LRScheduler.__init__.
        def __new__(klass, *args, **kwargs):
            obj = object.__new__(klass)
            registry.append(weakref.ref(obj))
            return obj

        self._patch(cls, "__new__", __new__)

    # ----------------------------------------------------------------- discovery

    def live(self, registry: list[weakref.ref]) -> list:
        """The objects of a registry that still exist, in creation order."""
        return [o for o in (r() for r in registry) if o is not None]

    def top_schedulers(self) -> list:
        """Schedulers not owned by a composite one (SequentialLR, ChainedScheduler)."""
        scheds = self.live(self.schedulers)
        children = {id(c) for s in scheds for c in getattr(s, "_schedulers", [])}
        return [s for s in scheds if id(s) not in children]

    def set_models(self, models: list[torch.nn.Module]) -> None:
        """Use these models for checkpoints, layer names and the forward timing hook."""
        self.models = list(models)
        if self._model_hook is not None:
            self._model_hook.remove()
            self._model_hook = None
        self._set_forward_hook(self._forward_on)

    def _set_forward_hook(self, on: bool) -> None:
        self._forward_on = on
        if on and self._model_hook is None and self.models:
            self._model_hook = self.models[0].register_forward_pre_hook(self._on_forward)
        elif not on and self._model_hook is not None:
            self._model_hook.remove()
            self._model_hook = None

    def _discover(self, opt: torch.optim.Optimizer) -> None:
        if not self.models:
            self.set_models(checkpoint.find_models([opt]))
        self.layer_params = [p for g in opt.param_groups for p in g["params"]]
        self.engine.on_discovered(opt)

    # ----------------------------------------------------------------- the patches

    def _wrap_backward(self, original):
        hooks, doctor, Tensor = self, self.engine.doctor, torch.Tensor

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

    def _wrap_scale(self, original):
        hooks = self

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

    def _wrap_zero_grad(self, original):
        hooks, doctor = self, self.engine.doctor

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

    def _wrap_clip(self, original):
        hooks = self

        @torch.no_grad()
        def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None):
            params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
            override = hooks.engine.settings.clip
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

    def _wrap_clip_with_norm(self, original):
        hooks = self

        def clip_grads_with_norm_(parameters, max_norm, total_norm, foreach=None):
            override = hooks.engine.settings.clip
            effective = float(max_norm) if override is None else override
            hooks._note_clip(total_norm, None, None, effective)
            return original(parameters, effective, total_norm, foreach)

        clip_grads_with_norm_.__wrapped__ = original
        return clip_grads_with_norm_

    def _note_clip(self, total, per_tensor, params, max_norm: float) -> None:
        self._clip_max = max_norm
        if per_tensor is not None:
            self._norms = (per_tensor, total)
            self.layer_params = params
        else:
            self._norms = (None, total)

    # ---------------------------------------------------------------- step hooks

    def _is_main(self, opt) -> bool:
        main = self.main() if self.main is not None else None
        if main is None:
            # The first optimizer that steps is the main one (or the next, once it is gone).
            self.main = weakref.ref(opt)
            self._params_of = (None, 0)
            if not any(r() is opt for r in self.optimizers):
                self.optimizers.append(weakref.ref(opt))
            return True
        return main is opt

    def _pre_step(self, opt, args, kwargs):
        if self._resume is not None:
            self._resume_fire()
        main = self._is_main(opt)
        closure = args[1] if len(args) > 1 else kwargs.get("closure") if kwargs else None
        if main:
            self._t_pre = _perf_counter()
            if not self._dist_checked:
                self._dist_checked = True
                self.engine.setup_distributed()
            controls = self.engine.controls
            if controls.has_work(self.step):
                if closure is None:
                    # Serve what the forward hook would have served (model not known yet).
                    controls.at_save_point(self.step)
                controls.at_step_start(self.step)
                if closure is not None:
                    controls.at_save_point(self.step)
            self._in_step = True
            self._closure_loss_index = len(self._losses) if closure is not None else None
        result = None
        if closure is not None:
            wrapped = self._wrap_closure(opt, closure, main)
            if len(args) > 1:
                result = ((args[0], wrapped, *args[2:]), kwargs)
            else:
                result = (args, {**kwargs, "closure": wrapped})
        else:
            self._grads_ready(opt, main, True)
        if self.engine.settings.lr_scale != 1.0:
            self._scale_lr(opt)
        return result

    def _wrap_closure(self, opt, closure, main: bool):
        calls = 0

        def ptdash_closure():
            nonlocal calls
            loss = closure()
            calls += 1
            # LBFGS evaluates the closure several times per step: clip after every
            # evaluation, measure the norm of the first.
            self._grads_ready(opt, main, measure=calls == 1)
            return loss

        return ptdash_closure

    def _measure(self, opt) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
        """The parameters with a gradient, their per-parameter norms and the total norm."""
        if self._params_of != (id(opt), len(opt.param_groups)):
            # Rebuilt for a new main optimizer, and when ``add_param_group`` added a group.
            self._params_of = (id(opt), len(opt.param_groups))
            self._params = [p for g in opt.param_groups for p in g["params"]]
            self._fused = None
        params = self._params
        # map and filter in C: no Python frame per parameter.
        grads = list(filter(_IS_SET, map(_GRAD, params)))
        if len(grads) != len(params):
            return ([p for p in params if p.grad is not None], *metrics.grad_norms(grads))
        if self._fused is None and grads:
            self._fused = metrics.fused_ok(grads)
        if self._fused:  # grad_norms's own fast path, without its per-step checks
            return (params, *metrics.fused_norms(grads))
        return (params, *metrics.grad_norms(grads))

    def _grads_ready(self, opt, main: bool, measure: bool) -> None:
        override = self.engine.settings.clip
        script_clipped = self._clip_max is not None
        if not main or not measure:
            if override is not None and not script_clipped:
                params = [p for g in opt.param_groups for p in g["params"] if p.grad is not None]
                _, total = metrics.grad_norms([p.grad for p in params])
                metrics.clip_with_norm(params, override, total)
            return
        norms = self._norms
        if norms is None or norms[0] is None:
            params, per_tensor, total = self._measure(opt)
            # A total the script passed to clip_grads_with_norm_ stays the pre-clip norm.
            self._norms = norms = (per_tensor, total if norms is None else norms[1])
            self.layer_params = params
            if override is not None and not script_clipped:
                metrics.clip_with_norm(params, override, total)
                self._clip_max = override
        per_tensor, total = norms
        doctor = self.engine.doctor
        if doctor.watching:
            doctor.on_pre_step(opt, self.step + 1, self.layer_params)
        if total.is_cpu:
            # On CPU reading two scalars waits for nothing, so a non-finite gradient is caught
            # before the update (at ~0.1 ms a step on a 2-core box, the hot path's largest
            # cost after the norm pass). On CUDA it would be a sync per step: the flusher
            # reports it there instead, a flush later.
            if self._closure_loss_index is None:
                finite = _isfinite(total.item())
                for loss in self._losses:
                    if loss.is_cpu and not _isfinite(loss.item()):
                        finite = False
                if not finite:
                    self.engine.on_nonfinite(opt, self.step + 1, per_tensor, self.layer_params)
                    return
        elif self.grad_device != total.device.type:
            self.grad_device = total.device.type
        every = self.update_ratio_every
        if every and (self.step + 1) % every == 0 and self.layer_params:
            self._before_params = self.layer_params
            self._before = torch._foreach_mul(metrics.ratio_samples(self._before_params), 1.0)

    def _scale_lr(self, opt) -> None:
        scale = self.engine.settings.lr_scale
        for group in opt.param_groups:
            self._saved_lrs.append((group, group["lr"]))
            group["lr"] = group["lr"] * scale

    def _restore_lr(self) -> list:
        effective = [group["lr"] for group, _ in self._saved_lrs]
        for group, lr in self._saved_lrs:
            group["lr"] = lr
        self._saved_lrs.clear()
        return effective

    def _post_step(self, opt, args, kwargs) -> None:
        lrs = self._restore_lr() if self._saved_lrs else None
        if self.main is None or self.main() is not opt:
            return
        now = _perf_counter()
        step = self.step + 1
        losses = self._losses
        index = self._closure_loss_index
        if index is not None:  # a closure: the loss of its first evaluation
            losses = losses[index:index + 1] if len(losses) > index else losses[:index]
        if lrs is None:
            lrs = list(map(_LR, opt.param_groups))
        if set(map(type, lrs)) != _FLOAT:
            # A tensor LR (capturable optimizers) changes in place: keep this step's value.
            lrs = [lr.detach().clone() if isinstance(lr, torch.Tensor) else float(lr) for lr in lrs]
        per_tensor, total = self._norms if self._norms is not None else (None, None)
        ratios = None
        if self._before is not None:
            ratios = metrics.update_ratio(self._before, metrics.ratio_samples(self._before_params))
            self._before = self._before_params = None
        engine = self.engine
        engine.recorder.add((  # recorder.STEP_RECORD
            step, time.time(), losses, total, per_tensor, self.layer_params if per_tensor is not None else None,
            self._clip_max, lrs, (self._t_post, self._t_forward, self._t_pre, now), self._samples, ratios,
            engine.take_user_values() if engine.user_values else None))
        step_s = now - self._t_post
        self.last_step_s = 0.9 * self.last_step_s + 0.1 * step_s if self.last_step_s else step_s
        doctor = engine.doctor
        if step >= doctor.post_from:
            doctor.on_post_step(opt, step)
        self.step = step
        self._losses = []
        self._norms = None
        self._clip_max = None
        self._in_step = False
        self._closure_loss_index = None
        self._t_post = now
        self._t_forward = None
        self._samples = 0
        if not self._discovered:  # the first step of this process (a resumed run starts at N)
            self._discovered = True
            self._discover(opt)
        engine.on_step_end(step)
        # The forward hook times the data wait and serves checkpoints at the start of a
        # step: it is installed for the steps the doctor watches and when a save is due.
        pending = engine.controls.pending
        want = doctor.watching or bool(pending.checkpoint) or pending.stop is not None
        if want is not self._forward_on:
            self._set_forward_hook(want)

    def _on_forward(self, module, args) -> None:
        if self._in_step or not torch.is_grad_enabled():
            return  # a closure's forward, or an evaluation pass
        if self._t_forward is None:
            self._t_forward = _perf_counter()
        if args and isinstance(args[0], torch.Tensor):
            shape = args[0].shape
            if shape:
                self._samples += shape[0]
        controls = self.engine.controls
        if controls.has_work(self.step):
            controls.at_save_point(self.step)
