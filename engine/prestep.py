"""The optimizer pre-step hook: the main step's boundary (commands first), then the
gradients' norms, the live clip, the pre-update finite check and the LR factor.

It runs before every optimizer's update. On a step the cost budget samples, or with
anything at the boundary, it takes the full path: the optimizer's bookkeeping
(tracked.py), the boundary (queued commands, a pause, a save), a closure wrapped
(wrappers.py) or the gradients measured now (``grads_ready``: one fused norm pass, shared
with the script's own clip), and the LR factor around the update. Otherwise it takes the
lean path: only the step's loss is checked before the update (on CPU), and the step's end
(stepend.py) records what that path measured. After a lean step it comes off for the lean
steps that follow (``take_off``): a CPU loss was checked at its backward already, and
whatever would give it work puts it back first (``put_back``).
"""

from __future__ import annotations

import math
import time

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from . import metrics, sharded, wrappers
from .checkpoint import FirstForward
from .tracked import Tracked

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


class PreStep:
    """The optimizer pre-step hook and the main step's boundary.

    It reads and writes the shared per-step ``state`` (stepstate.py), finds each optimizer
    in ``optimizers`` (tracked.py), applies the live ``settings`` (clip, LR factor) and
    the ``controls`` queued for the boundary, has ``anomalies.judge`` judge a CPU step before
    its update, hands a bad one (non-finite, or a spike) to ``anomalies``, and shows the doctor's watched steps to ``doctor``; ``budget`` says
    which steps are sampled, and ``first_step()`` is called at the first boundary (before
    the first update: join the rank channel).
    """

    def __init__(self, state, optimizers, settings, controls, anomalies, doctor, budget, first_step) -> None:
        self._state, self._optimizers, self._settings, self._controls = state, optimizers, settings, controls
        self._anomalies, self._doctor, self._budget, self._first_step = anomalies, doctor, budget, first_step
        self._attached = False
        self._handle = None
        """The registered hook; None while it is off (``take_off``) or detached."""
        self._resume: FirstForward | None = None
        self._dist_checked = False
        self._judge = anomalies.judge
        """The one judge (judge.py): a CPU step's values are judged before its update."""

    def attach(self) -> None:
        """Register the hook (the caller attaches once)."""
        self._attached = True
        self._handle = register_optimizer_step_pre_hook(self.pre_step)

    def arm_resume(self, apply) -> None:
        """Load a checkpoint at the first module forward or optimizer step (checkpoint.py)."""
        self._resume = FirstForward(apply)

    def detach(self) -> None:
        """Remove the hook (and a resume still armed)."""
        if self._resume is not None:
            self._resume.remove()
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        self._attached = False
        self._state.pre_off, self._state.skipping = False, None

    def pre_step(self, opt, args, kwargs):
        """The global optimizer step pre-hook, before every optimizer's update."""
        state = self._state
        t_in = _perf_counter()
        state.skipping = None  # this step has its pre-step hook
        lean = state.lean.get(id(opt)) if state.lean else None
        if (lean is not None and len(args) == 1 and not kwargs and not state.clip_notes.notes
                and not self._controls.has_work(state.step) and lean.ref() is opt):
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
                        state.unmetered(self._anomalies.before_update, opt, state.step + 1, None, [])
                        state.lean = {}  # commands may have been applied in its pause
                        break
                    if value > state.loss_max and self._judged(opt, [value], None):
                        state.lean = {}
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
        tracked = self._optimizers.track(opt)
        main = tracked.index == 0
        closure = args[1] if len(args) > 1 else kwargs.get("closure") if kwargs else None
        if main:
            state.began()
            self.boundary()
            if closure is not None and self._controls.has_work(state.step):
                self._controls.at_save_point(state.step)
            # ptdash's own time counts from here: the boundary may have paused or saved.
            state.t_pre = t_in = _perf_counter()
            state.in_step = True
        tracked.closure_losses = len(state.losses) if closure is not None else None
        if closure is not None and main:
            self._judge.owe(state.step + 1)  # its values come from the closure: judged at the flush
        result = None
        if closure is not None:
            wrapped = wrappers.wrap_closure(state, self.grads_ready, tracked, closure)
            if len(args) > 1:
                result = ((args[0], wrapped, *args[2:]), kwargs)
            else:
                result = (args, {**kwargs, "closure": wrapped})
        else:
            self.grads_ready(tracked, True)
        if self._settings.lr_scale != 1.0:
            tracked.scale_lr(self._settings.lr_scale)
        state.own += _perf_counter() - t_in
        return result

    def grads_ready(self, tracked: Tracked, measure: bool) -> None:
        """The step's gradients are final (before its update): norms, clip, checks."""
        state = self._state
        opt = tracked.ref()
        override = self._settings.clip
        note = state.clip_notes.take(tracked)
        tracked.params()  # up to date: whether they are shards
        if not measure:  # a closure's later evaluations (LBFGS): clip only
            if override is not None and note is None:
                params, _, total = tracked.measure_full() if tracked.sharded else tracked.measure()
                metrics.clip_with_norm(params, override, total)
            return
        t0 = _perf_counter()
        step = state.step + 1
        main = tracked.index == 0
        every = state.update_ratio_every
        tracked.local = False
        if note is not None and note[1] is not None:
            params, per_tensor, total, tracked.clip_max = note
        elif note is not None and step % self._budget.every:
            # The script's total without per-parameter norms (clip_grads_with_norm_, FSDP1's
            # clip): kept every step; the per-parameter norms only on the steps sampled.
            params, per_tensor, (total, tracked.clip_max) = None, None, note[2:]
            if every and step % every == 0:
                state.ratio_owed = True
        elif note is None and override is None and step % self._budget.every:
            # A step the budget does not sample (budget.py): no norms, and on CPU only the
            # loss is checked before the update; the gradients are checked on sampled steps.
            tracked.norms = None
            if every and step % every == 0:
                state.ratio_owed = True
            if tracked.closure_losses is None:
                if not _finite_on_cpu(state.losses):
                    state.unmetered(self._anomalies.before_update, opt, step, None, [])
                elif main:
                    self._judged(opt, state.losses, None)
            return
        elif note is None and override is not None and tracked.sharded:
            # A live clip of shards: the whole model's total, a collective that every rank
            # makes here, at every step from the one the clip was applied at (sharded.py).
            params, per_tensor, total = tracked.measure_full()
            metrics.clip_with_norm(params, override, total)
            tracked.clip_max = override
        else:
            params, per_tensor, total = tracked.measure()
            if note is not None:  # clip_grads_with_norm_: the script's total stays the pre-clip norm
                total, tracked.clip_max = note[2], note[3]
            elif override is not None:
                metrics.clip_with_norm(params, override, total)
                tracked.clip_max = override
            else:
                # Of shards, this total is the local shards' (grad/norm_local), and a rank's
                # non-finite shard is left to the loss: one rank alone must not pause.
                tracked.local = bool(tracked.sharded)
        tracked.norms = (per_tensor, total, params)
        if main and self._doctor.watching:
            self._doctor.on_pre_step(opt, step, params if params is not None else tracked.with_grad())
        if tracked.local:
            if tracked.closure_losses is None and not _finite_on_cpu(state.losses):
                state.extra += _perf_counter() - t0
                state.unmetered(self._anomalies.before_update, opt, step, None, [])
                return
        elif total.is_cpu:
            # On CPU reading two scalars waits for nothing, so a non-finite gradient is caught
            # before the update. On CUDA it would be a sync per step: the flusher reports it
            # there instead, a flush later.
            if tracked.closure_losses is None:
                norm = total.item()
                if not (_isfinite(norm) and _finite_on_cpu(state.losses)):
                    state.extra += _perf_counter() - t0
                    state.unmetered(self._anomalies.before_update, opt, step, per_tensor, params)
                    return
                if main and self._judged(opt, state.losses, norm):
                    state.extra += _perf_counter() - t0
                    return
        if main and every and (step % every == 0 or state.ratio_owed) and params:
            state.ratio_owed = False
            state.before_params = params = sharded.local(params) if tracked.sharded else params
            state.before = metrics.snapshot(params)
        state.extra += _perf_counter() - t0

    def _judged(self, opt, losses: list, norm: float | None) -> bool:
        """Whether the judge found this CPU step a spike before its update (and the anomaly
        handler paused, skipped, rolled back or warned: ``anomalies.py``)."""
        state = self._state
        lr = opt.param_groups[0]["lr"]  # the LR factor is applied after this: the judge sees the effective LR
        finding = self._judge.at_step(state.step + 1, losses, norm,
                                      lr * self._settings.lr_scale if type(lr) is float else None)
        if finding is None:
            return False
        state.unmetered(self._anomalies.before_update, opt, finding.step, None, [], finding)
        return True

    def boundary(self) -> None:
        """The main step's boundary: apply queued commands, once per step, before its update."""
        state = self._state
        if state.at_boundary:
            return
        state.at_boundary = True
        if not self._dist_checked:
            self._dist_checked = True
            self._first_step()
        controls = self._controls
        if controls.has_work(state.step):
            # Serve what the forward hook would have served (no model known, or not installed).
            controls.at_save_point(state.step)
            controls.at_step_start(state.step)

    # ------------------------------------------------------ the hook off

    def take_off(self) -> None:
        """Take the pre-step hook off for the lean steps that follow a lean step (training thread,
        at a main step's end): on such a step it has nothing to do, and a call is microseconds.

        What it would check is checked where it can change, and each of those puts it back
        (``put_back``) before the step that needs it: a non-finite CPU loss, a second
        CPU micro-batch, a scaled loss or anything else that sends a backward down the full
        path (wrappers.py), a clip call, an optimizer it does not know, a closure (their
        steps then take the full path); commands, checkpoints and stops are looked at when a
        main step ends, so one that comes in during a lean step is served a step later.
        """
        state = self._state
        if self._attached:
            if not state.pre_off:
                self._handle.remove()
                self._handle = None
                state.pre_off = True
            state.skipping = state.lean

    def put_back(self) -> None:
        """Put the pre-step hook back (training thread, never inside an optimizer's step hooks):
        the next step's pre-step hook takes the lean path or the full one, as it decides. A
        step under way that began without it is still known as one (``StepState.skipping``) when it ends."""
        state = self._state
        if state.pre_off:
            state.pre_off = False
            if self._attached:
                self._handle = register_optimizer_step_pre_hook(self.pre_step)
