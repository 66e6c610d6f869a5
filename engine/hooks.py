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
- a forward pre-hook on the model once it is known: time spent waiting for data, the
  batch size, and the save point at the start of each step.

Nothing here waits for the device: the only ``.item()`` calls read CPU tensors.
"""

from __future__ import annotations

import math
import time
import weakref
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from . import checkpoint, metrics
from .patching import Patches
from .recorder import StepRecord


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
        # Per-step state, reset after each step of the main optimizer.
        self._losses: list[torch.Tensor] = []
        self._norms: tuple[torch.Tensor, torch.Tensor] | None = None
        self._clip_max: float | None = None
        self._saved_lrs: list[tuple[dict, Any]] = []
        self._in_step = False
        self._closure_loss_index: int | None = None
        self._t_post = time.perf_counter()
        self._t_forward: float | None = None
        self._t_pre: float | None = None
        self._samples = 0
        self.layer_params: list[torch.Tensor] = []
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
        if self.models and self._model_hook is None:  # attached again after a detach
            self._model_hook = self.models[0].register_forward_pre_hook(self._on_forward)

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
        if self.models:
            self._model_hook = self.models[0].register_forward_pre_hook(self._on_forward)

    def _discover(self, opt: torch.optim.Optimizer) -> None:
        if not self.models:
            self.set_models(checkpoint.find_models([opt]))
        self.layer_params = [p for g in opt.param_groups for p in g["params"]]
        self.engine.on_discovered(opt)

    # ----------------------------------------------------------------- the patches

    def _wrap_backward(self, original):
        hooks = self

        def backward(tensors, *args, **kwargs):
            t = tensors if isinstance(tensors, torch.Tensor) else None
            if t is None and isinstance(tensors, (list, tuple)) and len(tensors) == 1:
                t = tensors[0]
            if isinstance(t, torch.Tensor) and t.numel() == 1:
                raw = getattr(t, "_ptdash_raw", None)
                hooks._losses.append((raw if raw is not None else t).detach().reshape(()))
            hooks.engine.doctor.on_backward()
            return original(tensors, *args, **kwargs)

        backward.__wrapped__ = original
        return backward

    def _wrap_scale(self, original):
        def scale(scaler, outputs):
            scaled = original(scaler, outputs)
            if isinstance(outputs, torch.Tensor) and isinstance(scaled, torch.Tensor):
                # The loss before scaling, for the loss chart (no sync: a tensor attribute).
                scaled._ptdash_raw = outputs.detach()
            return scaled

        scale.__wrapped__ = original
        return scale

    def _wrap_zero_grad(self, original):
        hooks = self

        def zero_grad(opt, *args, **kwargs):
            if (hooks.main is None or hooks.main() is opt) and not hooks._in_step:
                # What a step GradScaler skipped left behind (no optimizer hook fired)
                # must not be counted in the next step.
                hooks._losses.clear()
                hooks._norms = None
                hooks._clip_max = None
            hooks.engine.on_zero_grad(opt)
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
        if self.main is None or self.main() is None:
            # The first optimizer that steps is the main one (or the next, once it is gone).
            self.main = weakref.ref(opt)
            if not any(r() is opt for r in self.optimizers):
                self.optimizers.append(weakref.ref(opt))
        return self.main() is opt

    def _pre_step(self, opt, args, kwargs):
        if self._resume is not None:
            self._resume_fire()
        main = self._is_main(opt)
        closure = args[1] if len(args) > 1 else kwargs.get("closure")
        if main:
            self._t_pre = time.perf_counter()
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
            self._grads_ready(opt, main, measure=True)
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

    def _grads_ready(self, opt, main: bool, measure: bool) -> None:
        override = self.engine.settings.clip
        script_clipped = self._clip_max is not None
        if not main or not measure:
            if override is not None and not script_clipped:
                params = [p for g in opt.param_groups for p in g["params"] if p.grad is not None]
                _, total = metrics.grad_norms([p.grad for p in params])
                metrics.clip_with_norm(params, override, total)
            return
        if self._norms is None or self._norms[0] is None:
            params = [p for g in opt.param_groups for p in g["params"] if p.grad is not None]
            per_tensor, total = metrics.grad_norms([p.grad for p in params])
            if self._norms is None:
                self._norms = (per_tensor, total)
            else:  # the script passed its own total norm: keep it as the pre-clip norm
                self._norms = (per_tensor, self._norms[1])
            self.layer_params = params
            if override is not None and not script_clipped:
                metrics.clip_with_norm(params, override, total)
                self._clip_max = override
        per_tensor, total = self._norms
        self.grad_device = total.device.type
        self.engine.doctor.on_pre_step(opt, self.step + 1, self.layer_params)
        closure = self._closure_loss_index is not None
        if not closure and total.device.type == "cpu" and not (
                math.isfinite(total.item())
                and all(math.isfinite(l.item()) for l in self._losses if l.device.type == "cpu")):
            # On CPU this check is free (no device to wait for), so a non-finite gradient is
            # caught before the update. On CUDA it would be a sync per step: the flusher
            # reports it there instead, a flush later.
            self.engine.on_nonfinite(opt, self.step + 1, per_tensor, self.layer_params)
        elif self.update_ratio_every and (self.step + 1) % self.update_ratio_every == 0 and self.layer_params:
            self._before_params = self.layer_params
            self._before = torch._foreach_mul([p.detach() for p in self._before_params], 1.0)

    def _scale_lr(self, opt) -> None:
        scale = self.engine.settings.lr_scale
        if scale != 1.0:
            for group in opt.param_groups:
                self._saved_lrs.append((group, group["lr"]))
                group["lr"] = group["lr"] * scale

    def _restore_lr(self) -> list:
        effective = [(group, group["lr"]) for group, _ in self._saved_lrs]
        for group, lr in self._saved_lrs:
            group["lr"] = lr
        self._saved_lrs.clear()
        return effective

    def _post_step(self, opt, args, kwargs) -> None:
        effective = self._restore_lr()
        if self.main is None or self.main() is not opt:
            return
        now = time.perf_counter()
        record = StepRecord(step=self.step + 1, wall=time.time())
        host, device = record.host, record.device
        if self._closure_loss_index is not None and len(self._losses) > self._closure_loss_index:
            device["loss"] = self._losses[self._closure_loss_index]
            host["loss/micro_batches"] = 1.0
        elif self._losses:
            losses = self._losses if self._closure_loss_index is None else self._losses[:self._closure_loss_index]
            if losses:
                # A left fold, as a script summing its micro-batch losses would.
                total = losses[0]
                for loss in losses[1:]:
                    total = total + loss
                device["loss"] = total
                host["loss/micro_batches"] = float(len(losses))
        if self._norms is not None:
            per_tensor, total = self._norms
            device["grad/norm_total"] = total
            if per_tensor is not None:
                record.layers = per_tensor
                record.params = self.layer_params
            if self._clip_max is not None:
                host["grad/clip_max"] = self._clip_max
                device["grad/clipped"] = (total > self._clip_max).float()
        if self._before is not None:
            record.update_ratios = metrics.update_ratio(self._before, [p.detach() for p in self._before_params])
            self._before = self._before_params = None
        lr_source = effective or [(g, g["lr"]) for g in opt.param_groups]
        for i, (_, lr) in enumerate(lr_source):
            _put(host, device, f"opt/lr/group{i}", lr)
        host["time/step_s"] = step_s = now - self._t_post
        self.last_step_s = step_s if not self.last_step_s else 0.9 * self.last_step_s + 0.1 * step_s
        if self._t_forward is not None and self._t_pre is not None:
            host["time/data_s"] = max(0.0, self._t_forward - self._t_post)
            host["time/compute_s"] = max(0.0, self._t_pre - self._t_forward)
            host["time/optim_s"] = now - self._t_pre
        if self._samples:
            host["throughput/samples_per_s"] = self._samples / max(now - self._t_post, 1e-9)
        self.engine.fill_record(record)
        self.engine.recorder.add(record)
        self.engine.doctor.on_post_step(opt, self.step + 1)
        self.step += 1
        self._losses.clear()
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
        self.engine.on_step_end(self.step)

    def _on_forward(self, module, args) -> None:
        if self._in_step or not torch.is_grad_enabled():
            return  # a closure's forward, or an evaluation pass
        if self._t_forward is None:
            self._t_forward = time.perf_counter()
        if args and isinstance(args[0], torch.Tensor) and args[0].dim() > 0:
            self._samples += args[0].shape[0]
        if self.engine.controls.has_work(self.step):
            self.engine.controls.at_save_point(self.step)


def _put(host: dict, device: dict, name: str, value) -> None:
    if isinstance(value, torch.Tensor):
        device[name] = value.detach()
    else:
        host[name] = float(value)
