"""The step boundary: every hook ptdash puts on an optimizer step, and what a step records.

All of it is public PyTorch API or a plain attribute swap, installed by ``attach()`` and
undone by ``detach()``:

- global optimizer step pre/post hooks, for every optimizer: commands, pause, clipping,
  the LR factor, gradient norms (the pre-step hook, prestep.py), step counting, timing
  and the step's record (the post-step hook, stepend.py);
- ``torch.autograd.backward``, ``GradScaler.scale``, ``Optimizer.zero_grad``,
  ``clip_grad_norm_`` / ``clip_grads_with_norm_`` (wrappers.py): the loss, the unscaled
  loss, and the live clip value over the script's own;
- the script's DataLoaders (loaders.py), optimizers, schedulers and scalers (discovery.py);
- a forward pre-hook on the model (forward.py), on the steps the doctor watches and
  whenever a checkpoint is due: when the step's compute starts, and the save point at its
  start.

**The step counter** counts the steps of the main optimizer: the first one that steps
(a GAN's discriminator, say). Every other optimizer's step is recorded at the main step
it follows, under ``opt<k>/...`` names (k in the order they first stepped); one that
steps HANDOVER_STEPS times in a row with no main step between is the main one from then
on (tracked.py, ``Optimizers``). A script with no optimizer gets its steps inferred
(manual.py). Commands take effect at the main step's boundary: the first of the main
optimizer's own ``clip_grad_norm_`` call and its step, so a clip changed "from step N" is
the clip step N's update used.

The hot path is what runs at every step: a loss reference kept at ``backward`` (on the
lean path a CPU loss is read there instead), its finite check on CPU, and a StepRecord
appended for the flusher. Once a step, caches are cold: each Python call and each tensor
call on this path costs microseconds, so the lean path makes as few as it can. On the
steps the cost budget samples (budget.py: all of them while it can afford it) also one
fused norm pass (shared with the script's own clipping, which makes it free: then it runs
every step) and the gradients' finite check on CPU. A step the budget does not sample,
with nothing at its boundary, takes the lean path, for every optimizer (a GAN's two): the
pre-step hook checks the loss and the post-step hook records. After a lean step the
pre-step hook comes off for the lean steps that follow (``PreStep.take_off``): a CPU loss
was checked at its backward already, and whatever would give the hook work puts it back
first. ptdash times its own code here (``StepState.own``, ``extra``) for the budget.
Everything else is sampled. Nothing here waits for the device: the only ``.item()``
calls read CPU tensors.

**The parts** each own what only they use, and share the per-step state as one object
(``StepState``, stepstate.py) handed to each: ``PreStep``, ``StepEnd``, ``InferredSteps``,
``ForwardHook``, ``Optimizers`` and the wrappers. No part reads another's private
attributes, and no call on the lean path goes through a layer of its own: each hook is a
part's own method, registered with torch directly, that reads the state into a local once.
``Hooks`` builds the parts and installs them.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from . import sharded, wrappers
from .budget import Budget
from .forward import ForwardHook
from .invisible import ModuleState, patch_warn
from .loaders import Loaders
from .manual import InferredSteps, ManualSteps
from .patching import Patches
from .prestep import PreStep
from .stepend import StepEnd
from .stepstate import StepState
from .tracked import Optimizers, Tracked


class Hooks:
    """Builds the step boundary's parts for one process, and installs and removes their hooks.

    It is handed what a step touches: the live ``settings``, the ``controls``
    applied at step boundaries, the ``recorder`` the records go to, the ``doctor``, the
    ``discovery`` registries, the ``anomalies`` handler of a non-finite step, the values
    ``ptdash.log`` gave (``user_values``), the ``journal`` (told of each other optimizer
    and of a handover of the main role), the ``budget`` that samples the steps, and three
    moments of the lifecycle: ``first_step()`` (before the first update: join the rank
    channel), ``discovered(opt)`` (after the first step) and ``step_end(step)``.
    """

    def __init__(self, settings, controls, recorder, doctor, discovery, anomalies, user_values, journal,
                 budget: Budget, first_step: Callable[[], None], discovered: Callable[[Any], None],
                 step_end: Callable[[int], None]) -> None:
        self.settings, self.doctor, self._discovery = settings, doctor, discovery
        self.state = state = StepState()
        """What the step boundary's parts share about the step under way (stepstate.py)."""
        self.loaders = Loaders()
        self.loaders.began = state.began
        self.manual = ManualSteps()
        self.optimizers = Optimizers(state, discovery, self.manual, journal)
        """Which optimizer is which (tracked.py)."""
        self.pre = PreStep(state, self.optimizers, settings, controls, anomalies, doctor, budget, first_step)
        """The optimizer pre-step hook and the main step's boundary (prestep.py)."""
        self.forward = ForwardHook(state, self.loaders, discovery, controls)
        """The model's forward pre-hook (forward.py)."""
        self.end = StepEnd(state, self.optimizers, self.pre, self.forward, recorder, user_values, self.loaders,
                           doctor, controls, settings, budget, discovery, self.manual, discovered, step_end)
        """The optimizer post-step hook: the step's record and the next step's path (stepend.py)."""
        self.inferred = InferredSteps(state, self.manual, self.optimizers, self.pre, self.end, discovery, settings,
                                      budget, anomalies, doctor, controls)
        """The steps of a script with no optimizer (manual.py)."""
        budget.on_change.append(self.end.period_changed)
        discovery.on_models.append(self.forward.models_changed)
        self._post_handle = None
        self._fsdp1 = None
        """The finder that patches FSDP1's clip when the script imports it (sharded.py)."""
        self._patches = Patches()
        self._module_state = ModuleState()
        self._module_state.hooks.append(self.forward.fn)

    @property
    def step(self) -> int:
        """Completed steps of the main optimizer (or inferred steps, with no optimizer)."""
        return self.state.step

    @step.setter
    def step(self, step: int) -> None:
        self.state.step = step

    @property
    def main(self) -> Tracked | None:
        """The main optimizer's bookkeeping, or None before any optimizer stepped."""
        return self.optimizers.main

    # ------------------------------------------------------------ attach / detach

    def attach(self) -> None:
        """Install every hook and patch (once: attaching again while attached does nothing,
        where hooks installed twice would count every step twice)."""
        if self._post_handle is not None:
            return
        self.pre.attach()
        self._post_handle = register_optimizer_step_post_hook(self.end.post_step)
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
        self._fsdp1 = sharded.when_imported(sharded.FSDP1_MODULE, self._patch_fsdp1)
        self._discovery.attach(self._patches)
        self.loaders.attach(self._patches)
        patch(torch.amp.GradScaler, "scale", wrappers.wrap_scale(self, torch.amp.GradScaler.scale))
        patch(torch.optim.Optimizer, "zero_grad", wrappers.wrap_zero_grad(self, torch.optim.Optimizer.zero_grad))
        self.loaders.timing = self.doctor.watching
        self.forward.set(self.forward.on)  # as it was, when attached again after a detach

    def _patch_fsdp1(self, module) -> None:
        """FSDP1's own clip (its method reduces the shards' norms): wrapped as torch's is."""
        fsdp = module.FullyShardedDataParallel
        self._patches.set(fsdp, "clip_grad_norm_", wrappers.wrap_fsdp_clip(self, fsdp.clip_grad_norm_))

    def end_manual_step(self) -> None:
        """The script ended: no next backward will end its last inferred step (manual.py)."""
        self.inferred.end_manual_step()

    def arm_resume(self, apply) -> None:
        """Load a checkpoint at the first module forward or optimizer step (checkpoint.py)."""
        self.pre.arm_resume(apply)

    def detach(self) -> None:
        """Undo everything ``attach`` did, newest first."""
        self.pre.detach()
        if self._post_handle is not None:
            self._post_handle.remove()
            self._post_handle = None
        self.forward.remove()
        if self._fsdp1 is not None:
            self._fsdp1.remove()
            self._fsdp1 = None
        self._patches.undo()
        self.loaders.detached()
