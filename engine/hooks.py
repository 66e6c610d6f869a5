"""The step boundary: every hook ptdash puts on an optimizer step, and what a step records.

All of it is public PyTorch API or a plain attribute swap, installed by ``attach()`` and
undone by ``detach()``:

- global optimizer step pre/post hooks, for every optimizer: commands, pause, clipping,
  the LR factor, gradient norms (the pre-step hook, here), step counting, timing and the
  step's record (the post-step hook, stepend.py);
- ``torch.autograd.backward``, ``GradScaler.scale``, ``Optimizer.zero_grad``,
  ``clip_grad_norm_`` / ``clip_grads_with_norm_`` (wrappers.py): the loss, the unscaled
  loss, and the live clip value over the script's own;
- the script's DataLoaders (loaders.py), optimizers, schedulers and scalers (discovery.py);
- a forward pre-hook on the model, on the steps the doctor watches and whenever a
  checkpoint is due: when the step's compute starts, and the save point at its start.

**The step counter** counts the steps of the main optimizer: the first one that steps
(a GAN's discriminator, say). Every other optimizer's step is recorded at the main step
it follows, under ``opt<k>/...`` names (k in the order they first stepped); one that
steps HANDOVER_STEPS times in a row with no main step between is the main one from then on
(``hand_over``). A script with
no optimizer gets its steps inferred (manual.py). Commands take effect at the main
step's boundary: the first of the main optimizer's own ``clip_grad_norm_`` call and its
step, so a clip changed "from step N" is the clip step N's update used.

The hot path is what runs at every step: a loss reference kept at ``backward`` (on the
lean path a CPU loss is read there instead), its finite check on CPU, and a StepRecord
appended for the flusher. Once a step, caches are cold: each Python call and each tensor
call on this path costs microseconds, so the lean path makes as few as it can. On the
steps the cost budget samples (budget.py: all of them while it can afford it) also one fused norm pass
(shared with the script's own clipping, which makes it free: then it runs every step) and
the gradients' finite check on CPU. A step the budget does not sample, with nothing at its
boundary, takes the lean path, for every optimizer (a GAN's two): the pre-step hook checks
the loss and the post-step hook records (stepend.py). After a lean step the pre-step hook
comes off for the lean steps that follow (``skip_pre_step``): a CPU loss was checked at its
backward already, and whatever would give the hook work puts it back first. ptdash times its own code here (``_own``,
``_extra``) for the budget. Everything else is sampled. Nothing here waits for the device:
the only ``.item()`` calls read CPU tensors.

``Hooks`` is one class put together from two mixins, so that no call on the per-step path
goes through another layer: ``StepEnd`` (stepend.py), the end of a step and its record, and
``InferredSteps`` (manual.py), the steps of a script with no optimizer.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from . import metrics, wrappers
from .budget import Budget
from .checkpoint import FirstForward
from .invisible import ModuleState, own, patch_warn
from .loaders import Loaders
from .manual import InferredSteps, ManualSteps
from .patching import Patches
from .stepend import StepEnd
from .stepstate import StepState
from .tracked import HANDOVER_STEPS, Tracked

_perf_counter = time.perf_counter
_isfinite = math.isfinite
_FLOAT64 = torch.float64


def _finite_on_cpu(losses: list) -> bool:
    """Whether the step's losses that can be read without waiting (floats, CPU tensors) are finite."""
    for loss in losses:
        if type(loss) is float:
            if not _isfinite(loss):
                return False
        elif loss.is_cpu and not _isfinite(loss.item()):
            return False
    return True


class Hooks(StepEnd, InferredSteps):
    """Installs the hooks and keeps the per-step bookkeeping for one process.

    It is handed the parts a step touches: the live ``settings``, the ``controls``
    applied at step boundaries, the ``recorder`` the records go to, the ``doctor``, the
    ``discovery`` registries, the ``anomalies`` handler of a non-finite step, the values
    ``ptdash.log`` gave (``user_values``), and three moments of the lifecycle:
    ``first_step()`` (before the first update: join the rank channel),
    ``discovered(opt)`` (after the first step) and ``step_end(step)``; ``no_step()`` is
    called once if backwards run and no step can be found, ``new_optimizer(k, opt)`` when
    another optimizer steps for the first time.
    """

    def __init__(self, settings, controls, recorder, doctor, discovery, anomalies, user_values,
                 first_step: Callable[[], None], discovered: Callable[[Any], None],
                 step_end: Callable[[int], None], no_step: Callable[[int], None] = lambda n: None,
                 new_optimizer: Callable[[int, Any], None] = lambda index, opt: None,
                 handed_over: Callable[[Any, Any, int], None] = lambda opt, old, index: None) -> None:
        self.settings, self.controls, self.recorder, self.doctor = settings, controls, recorder, doctor
        self.discovery, self.anomalies, self.user_values = discovery, anomalies, user_values
        self._first_step, self._discovered_cb, self._step_end, self._no_step = first_step, discovered, step_end, no_step
        self._new_optimizer, self._handed_over = new_optimizer, handed_over
        self.state = state = StepState()
        """What the step boundary's parts share about the step under way (stepstate.py)."""
        self.loaders = Loaders()
        self.loaders.began = state.began
        self.manual = ManualSteps()
        self.main: Tracked | None = None
        self._tracked: dict[int, Tracked] = {}
        """id(optimizer) -> its bookkeeping, for every optimizer that stepped."""
        self._handles: list[Any] = []
        self._patches = Patches()
        self._module_state = ModuleState()
        self._model_hook = None
        self._forward_fn = own(self._on_forward)
        self._module_state.hooks.append(self._forward_fn)
        self._forward_on = True
        """Whether the model's forward pre-hook is wanted (it is installed once a model is known)."""
        self._resume: FirstForward | None = None
        self._dist_checked = False
        self._discovered = False
        self._budget = Budget()
        discovery.on_models.append(self._on_models)

    @property
    def step(self) -> int:
        """Completed steps of the main optimizer (or inferred steps, with no optimizer)."""
        return self.state.step

    @step.setter
    def step(self, step: int) -> None:
        self.state.step = step

    @property
    def budget(self) -> Budget:
        """How sparsely per-layer statistics are sampled (``budget.every``); the engine gives its own."""
        return self._budget

    @budget.setter
    def budget(self, budget: Budget) -> None:
        self._budget = budget
        budget.on_change.append(self._period_changed)

    def _period_changed(self) -> None:
        # A lean next step was decided under the old period: decide again at the step.
        self.state.lean = {}

    # ------------------------------------------------------------ attach / detach

    def attach(self) -> None:
        """Install every hook and patch (once: attaching again while attached does nothing,
        where hooks installed twice would count every step twice)."""
        if self._handles:
            return
        self._handles += [register_optimizer_step_pre_hook(self._pre_step),
                          register_optimizer_step_post_hook(self._post_step)]
        patch = self._patches.set
        patch_warn(self._patches)
        self._module_state.attach(self._patches)
        patch(torch.autograd, "backward", wrappers.wrap_backward(self, torch.autograd.backward))
        clip_module = torch.nn.utils.clip_grad
        clip = wrappers.wrap_clip(self, clip_module.clip_grad_norm_)
        patch(clip_module, "clip_grad_norm_", clip)
        patch(torch.nn.utils, "clip_grad_norm_", clip)
        if hasattr(torch.nn.utils, "clip_grads_with_norm_"):
            with_norm = wrappers.wrap_clip_with_norm(self, torch.nn.utils.clip_grads_with_norm_)
            patch(torch.nn.utils, "clip_grads_with_norm_", with_norm)
            if hasattr(clip_module, "clip_grads_with_norm_"):
                patch(clip_module, "clip_grads_with_norm_", with_norm)
        self.discovery.attach(self._patches)
        self.loaders.attach(self._patches)
        patch(torch.amp.GradScaler, "scale", wrappers.wrap_scale(self, torch.amp.GradScaler.scale))
        patch(torch.optim.Optimizer, "zero_grad", wrappers.wrap_zero_grad(self, torch.optim.Optimizer.zero_grad))
        self.loaders.timing = self.doctor.watching
        self._set_forward_hook(self._forward_on)  # as it was, when attached again after a detach

    def arm_resume(self, apply) -> None:
        """Load a checkpoint at the first module forward or optimizer step (checkpoint.py)."""
        self._resume = FirstForward(apply)

    def detach(self) -> None:
        """Undo everything ``attach`` did, newest first."""
        state = self.state
        if self._resume is not None:
            self._resume.remove()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        state.pre_off, state.skipping = False, None
        if self._model_hook is not None:
            self._model_hook.remove()
            self._model_hook = None
        self._patches.undo()
        self.loaders.detached()

    # ------------------------------------------------------- the model's forward hook

    def _on_models(self, models: list[torch.nn.Module]) -> None:
        """The models changed: the forward timing hook goes on the new first one."""
        on = self._forward_on
        self._set_forward_hook(False)
        self._set_forward_hook(on)

    def _set_forward_hook(self, on: bool) -> None:
        self._forward_on = on
        self.loaders.watch_batches(on)  # the forward hook reads which loader served the batch
        models = self.discovery.models
        if on and self._model_hook is None and models:
            self._model_hook = models[0].register_forward_pre_hook(self._forward_fn)
        elif not on and self._model_hook is not None:
            self._model_hook.remove()
            self._model_hook = None

    def _on_forward(self, module, args) -> None:
        state = self.state
        if state.in_step or not torch.is_grad_enabled():
            return  # a closure's forward, or an evaluation pass
        t_in = _perf_counter()
        if state.t_forward is None:
            state.began()
            state.t_forward = t_in
            self.loaders.mark_training()
        if args and isinstance(args[0], torch.Tensor):
            shape = args[0].shape
            if shape:
                state.samples += shape[0]
        state.own += _perf_counter() - t_in
        controls = self.controls
        if controls.has_work(state.step):
            controls.at_save_point(state.step)

    # ---------------------------------------------------------------- boundaries

    def boundary(self) -> None:
        """The main step's boundary: apply queued commands, once per step, before its update."""
        state = self.state
        if state.at_boundary:
            return
        state.at_boundary = True
        if not self._dist_checked:
            self._dist_checked = True
            self._first_step()
        controls = self.controls
        if controls.has_work(state.step):
            # Serve what the forward hook would have served (no model known, or not installed).
            controls.at_save_point(state.step)
            controls.at_step_start(state.step)

    def _tracked_for(self, opt) -> Tracked:
        state = self.state
        tracked = self._tracked.get(id(opt))
        if tracked is None or tracked.ref() is not opt:
            main = self.main.ref() if self.main is not None else None
            if main is None:
                # The first optimizer that steps is the main one (or the next, once it is gone).
                tracked = Tracked(opt, 0)
                self.main = tracked
                self.manual.active = False
                self.discovery.add(self.discovery.optimizers, opt)
            else:
                tracked = Tracked(opt, 1 + sum(t.index > 0 for t in self._tracked.values()))
                self._new_optimizer(tracked.index, opt)
            self._tracked[id(opt)] = tracked
        elif tracked.index and tracked.stepped_at == state.step and tracked.alone >= HANDOVER_STEPS - 1:
            self.hand_over(tracked)
        return tracked

    def hand_over(self, tracked: Tracked) -> None:
        """Another optimizer steps for the HANDOVER_STEPS-th time in a row with no main step
        between: the training has moved on to it (a network's Adam phase, then LBFGS, the first
        optimizer still referenced), so it is the main one from this step (the steps before
        it were kept at the main step they followed), and the old main takes its index."""
        state = self.state
        old = self.main
        tracked.index, old.index = 0, tracked.index
        self.main = tracked
        state.lean = {}  # decided for the old roles
        opt = tracked.ref()
        self.discovery.add(self.discovery.optimizers, opt)
        self._handed_over(opt, old.ref(), old.index)

    # ---------------------------------------------------------------- step hooks

    def _pre_step(self, opt, args, kwargs):
        state = self.state
        t_in = _perf_counter()
        state.skipping = None  # this step has its pre-step hook
        lean = state.lean.get(id(opt)) if state.lean else None
        if (lean is not None and len(args) == 1 and not kwargs and not state.clip_notes.notes
                and not self.controls.has_work(state.step) and lean.ref() is opt):
            # The lean path: a step the budget does not sample, of an optimizer already known,
            # with no closure, no clip or LR override and nothing for the boundary to serve.
            # Only the loss is checked before the update (on CPU: a float was checked at its
            # backward, wrappers.py); the step is recorded at its end.
            state.in_lean = lean
            if not lean.index:
                state.in_step = state.at_boundary = True
            losses = state.losses
            for loss in losses:
                if type(loss) is not float and loss.is_cpu:
                    value = loss.item()
                    if not _isfinite(value):
                        state.unmetered(self.anomalies.before_update, opt, state.step + 1, None, [])
                        state.lean = {}  # commands may have been applied in its pause
                        break
                    if len(losses) == 1 and loss.dtype is not _FLOAT64:
                        # Read already: the record keeps the number, the flush copies nothing.
                        # (The flush reads losses as float32; a float64 one waits for it.)
                        state.losses = [value]
            state.own += _perf_counter() - t_in
            return None
        if self._resume is not None:
            self._resume, resume = None, self._resume
            resume()
        tracked = self._tracked_for(opt)
        main = tracked.index == 0
        closure = args[1] if len(args) > 1 else kwargs.get("closure") if kwargs else None
        if main:
            state.began()
            self.boundary()
            if closure is not None and self.controls.has_work(state.step):
                self.controls.at_save_point(state.step)
            # ptdash's own time counts from here: the boundary may have paused or saved.
            state.t_pre = t_in = _perf_counter()
            state.in_step = True
        tracked.closure_losses = len(state.losses) if closure is not None else None
        result = None
        if closure is not None:
            wrapped = wrappers.wrap_closure(self, tracked, closure)
            if len(args) > 1:
                result = ((args[0], wrapped, *args[2:]), kwargs)
            else:
                result = (args, {**kwargs, "closure": wrapped})
        else:
            self.grads_ready(tracked, True)
        if self.settings.lr_scale != 1.0:
            tracked.scale_lr(self.settings.lr_scale)
        state.own += _perf_counter() - t_in
        return result

    def grads_ready(self, tracked: Tracked, measure: bool) -> None:
        """The step's gradients are final (before its update): norms, clip, checks."""
        state = self.state
        opt = tracked.ref()
        override = self.settings.clip
        note = state.clip_notes.take(tracked)
        if not measure:  # a closure's later evaluations (LBFGS): clip only
            if override is not None and note is None:
                params, _, total = tracked.measure()
                metrics.clip_with_norm(params, override, total)
            return
        t0 = _perf_counter()
        step = state.step + 1
        main = tracked.index == 0
        every = state.update_ratio_every
        if note is not None and note[1] is not None:
            params, per_tensor, total, tracked.clip_max = note
        elif note is None and override is None and step % self._budget.every:
            # A step the budget does not sample (budget.py): no norms, and on CPU only the
            # loss is checked before the update; the gradients are checked on sampled steps.
            tracked.norms = None
            if every and step % every == 0:
                state.ratio_owed = True
            if tracked.closure_losses is None and not _finite_on_cpu(state.losses):
                state.unmetered(self.anomalies.before_update, opt, step, None, [])
            return
        else:
            params, per_tensor, total = tracked.measure()
            if note is not None:  # clip_grads_with_norm_: the script's total stays the pre-clip norm
                total, tracked.clip_max = note[2], note[3]
            elif override is not None:
                metrics.clip_with_norm(params, override, total)
                tracked.clip_max = override
        tracked.norms = (per_tensor, total, params)
        if main and self.doctor.watching:
            self.doctor.on_pre_step(opt, step, params)
        if total.is_cpu:
            # On CPU reading two scalars waits for nothing, so a non-finite gradient is caught
            # before the update. On CUDA it would be a sync per step: the flusher reports it
            # there instead, a flush later.
            if tracked.closure_losses is None:
                if not (_isfinite(total.item()) and _finite_on_cpu(state.losses)):
                    state.extra += _perf_counter() - t0
                    state.unmetered(self.anomalies.before_update, opt, step, per_tensor, params)
                    return
        if main and every and (step % every == 0 or state.ratio_owed) and params:
            state.ratio_owed = False
            state.before_params = params
            state.before = metrics.snapshot(params)
        state.extra += _perf_counter() - t0

    # ------------------------------------------------------ the pre-step hook off

    def skip_pre_step(self) -> None:
        """Take the pre-step hook off for the lean steps that follow a lean step (training thread,
        at a main step's end): on such a step it has nothing to do, and a call is microseconds.

        What it would check is checked where it can change, and each of those puts it back
        (``pre_step_back``) before the step that needs it: a non-finite CPU loss, a second
        CPU micro-batch, a scaled loss or anything else that sends a backward down the full
        path (wrappers.py), a clip call, an optimizer it does not know, a closure (their
        steps then take the full path); commands, checkpoints and stops are looked at when a
        main step ends, so one that comes in during a lean step is served a step later.
        """
        state = self.state
        if self._handles:
            if not state.pre_off:
                self._handles[0].remove()
                state.pre_off = True
            state.skipping = state.lean

    def pre_step_back(self) -> None:
        """Put the pre-step hook back (training thread, never inside an optimizer's step hooks):
        the next step's pre-step hook takes the lean path or the full one, as it decides. A
        step under way that began without it is still known as one (``_skipping``) when it ends."""
        state = self.state
        if state.pre_off:
            state.pre_off = False
            if self._handles:
                self._handles[0] = register_optimizer_step_pre_hook(self._pre_step)
