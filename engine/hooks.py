"""Every hook and patch ptdash puts into torch, and what they record per step.

All of it is public PyTorch API or a plain attribute swap, installed by ``attach()`` and
undone by ``detach()``:

- global optimizer step pre/post hooks (here): the step boundary (commands, pause,
  clipping, LR factor, gradient norms, step counting and timing);
- ``torch.autograd.backward``, ``GradScaler.scale``, ``Optimizer.zero_grad``,
  ``clip_grad_norm_`` / ``clip_grads_with_norm_`` (wrappers.py): the loss, the unscaled
  loss, and the live clip value over the script's own;
- ``Optimizer.__init__``, ``LRScheduler.__new__``, ``GradScaler.__init__``
  (discovery.py): what checkpoints need;
- a forward pre-hook on the model once it is known, on the steps the doctor watches and
  whenever a checkpoint is due: time spent waiting for data, the batch size, and the save
  point at the start of a step.

The hot path is what runs at every step of the main optimizer: a loss reference kept at
``backward``, one fused norm pass (shared with the script's own clipping), a finite check
on CPU, and a StepRecord appended for the flusher. Everything else is sampled.

Nothing here waits for the device: the only ``.item()`` calls read CPU tensors.
"""

from __future__ import annotations

import functools
import math
import operator
import time
import weakref
from typing import Any, Callable

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from . import metrics, wrappers
from .discovery import find_models
from .patching import Patches
from .recorder import StepRecord

_GRAD = operator.attrgetter("grad")
_LR = operator.itemgetter("lr")
_IS_SET = functools.partial(operator.is_not, None)
_perf_counter = time.perf_counter
_isfinite = math.isfinite
_FLOAT = {float}


class Hooks:
    """Installs the hooks and keeps the per-step bookkeeping for one process.

    It is handed the parts a step touches: the live ``settings``, the ``controls``
    applied at step boundaries, the ``recorder`` the records go to, the ``doctor``, the
    ``discovery`` registries, the ``anomalies`` handler of a non-finite step, the values
    ``ptdash.log`` gave (``user_values``), and three moments of the lifecycle:
    ``first_step()`` (before the first update: join the rank channel),
    ``discovered(opt)`` (after the first step) and ``step_end(step)``.
    """

    def __init__(self, settings, controls, recorder, doctor, discovery, anomalies, user_values,
                 first_step: Callable[[], None], discovered: Callable[[Any], None],
                 step_end: Callable[[int], None]) -> None:
        self.settings, self.controls, self.recorder, self.doctor = settings, controls, recorder, doctor
        self.discovery, self.anomalies, self.user_values = discovery, anomalies, user_values
        self._first_step, self._discovered_cb, self._step_end = first_step, discovered, step_end
        self.step = 0
        """Completed steps of the main optimizer (the first one that stepped)."""
        self.main: weakref.ref | None = None
        discovery.on_models.append(self._on_models)
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
        self._patch(torch.autograd, "backward", wrappers.wrap_backward(self, torch.autograd.backward))
        clip_module = torch.nn.utils.clip_grad
        clip = wrappers.wrap_clip(self, clip_module.clip_grad_norm_)
        self._patch(clip_module, "clip_grad_norm_", clip)
        self._patch(torch.nn.utils, "clip_grad_norm_", clip)
        if hasattr(torch.nn.utils, "clip_grads_with_norm_"):
            with_norm = wrappers.wrap_clip_with_norm(self, torch.nn.utils.clip_grads_with_norm_)
            self._patch(torch.nn.utils, "clip_grads_with_norm_", with_norm)
            if hasattr(clip_module, "clip_grads_with_norm_"):
                self._patch(clip_module, "clip_grads_with_norm_", with_norm)
        self.discovery.attach(self._patches)
        self._patch(torch.amp.GradScaler, "scale", wrappers.wrap_scale(self, torch.amp.GradScaler.scale))
        self._patch(torch.optim.Optimizer, "zero_grad", wrappers.wrap_zero_grad(self, torch.optim.Optimizer.zero_grad))
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

    # ----------------------------------------------------------------- discovery

    def _on_models(self, models: list[torch.nn.Module]) -> None:
        """The models changed: the forward timing hook goes on the new first one."""
        if self._model_hook is not None:
            self._model_hook.remove()
            self._model_hook = None
        self._set_forward_hook(self._forward_on)

    def _set_forward_hook(self, on: bool) -> None:
        self._forward_on = on
        models = self.discovery.models
        if on and self._model_hook is None and models:
            self._model_hook = models[0].register_forward_pre_hook(self._on_forward)
        elif not on and self._model_hook is not None:
            self._model_hook.remove()
            self._model_hook = None

    def _discover(self, opt: torch.optim.Optimizer) -> None:
        if not self.discovery.models:
            self.discovery.set_models(find_models([opt]))
        self.layer_params = [p for g in opt.param_groups for p in g["params"]]
        self._discovered_cb(opt)

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
            self.discovery.add(self.discovery.optimizers, opt)
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
                self._first_step()
            controls = self.controls
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
        if self.settings.lr_scale != 1.0:
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
        override = self.settings.clip
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
        doctor = self.doctor
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
                    self.anomalies.before_update(opt, self.step + 1, per_tensor, self.layer_params)
                    return
        elif self.grad_device != total.device.type:
            self.grad_device = total.device.type
        every = self.update_ratio_every
        if every and (self.step + 1) % every == 0 and self.layer_params:
            self._before_params = self.layer_params
            self._before = torch._foreach_mul(metrics.ratio_samples(self._before_params), 1.0)

    def _scale_lr(self, opt) -> None:
        scale = self.settings.lr_scale
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
        self.recorder.add(StepRecord(
            step, time.time(), losses, total, per_tensor, self.layer_params if per_tensor is not None else None,
            self._clip_max, lrs, (self._t_post, self._t_forward, self._t_pre, now), self._samples, ratios,
            self.user_values.take() if self.user_values.pending else None))
        step_s = now - self._t_post
        self.last_step_s = 0.9 * self.last_step_s + 0.1 * step_s if self.last_step_s else step_s
        doctor = self.doctor
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
        self._step_end(step)
        # The forward hook times the data wait and serves checkpoints at the start of a
        # step: it is installed for the steps the doctor watches and when a save is due.
        pending = self.controls.pending
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
        controls = self.controls
        if controls.has_work(self.step):
            controls.at_save_point(self.step)
