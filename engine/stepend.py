"""The end of a step: the optimizer post-step hook, the step's record, the next step's path.

After each optimizer's step (``StepEnd.post_step``) the step's losses, norms, clip and LRs become
a StepRecord for the flusher: another optimizer's at the main step it follows, the main
one's (or an inferred step's, manual.py) with its timing, samples, update ratios and the
values ``ptdash.log`` gave (``end_step``). Then the next step's path is decided
(``_next_step``): whether the model's forward hook is wanted, and whether the next steps (of
every optimizer, until the next main step's end) may take the lean path, whose end (the
first branch of ``post_step``) records only what that path measured, and calls the
engine's ``step_end`` only while it has work at step ends (``ends_wanted``).
"""

from __future__ import annotations

import functools
import operator
import time

import torch

from . import metrics
from .discovery import find_models
from .recorder import RECORD_FIELDS, RecordShapeError, StepRecord
from .shared import names
from .tracked import HANDOVER_STEPS

_LR = operator.itemgetter("lr")
_record = functools.partial(tuple.__new__, StepRecord)
"""A StepRecord from a tuple of all its fields, without the Python frame of its ``__new__``:
so nothing checks its length but the builder, right after (``RECORD_FIELDS``)."""
_perf_counter = time.perf_counter
_FLOAT = {float}


def _held(lrs: list) -> list:
    """A step's LRs as the record keeps them: a tensor LR (capturable optimizers) changes in
    place, so this step's value is copied (on its device, no sync)."""
    return [lr.detach().clone() if isinstance(lr, torch.Tensor) else float(lr) for lr in lrs]


class StepEnd:
    """The optimizer post-step hook: a step's record, then the next step's path.

    It reads and resets the shared per-step ``state`` (stepstate.py): the records go to
    ``recorder``, with the values ``ptdash.log`` gave (``user_values``) and the batch waits
    ``loaders`` timed; ``optimizers`` says which optimizer stepped (tracked.py), ``pre``
    puts the pre-step hook back or takes it off (prestep.py) and ``forward`` the model's
    forward hook (forward.py); ``doctor``, ``controls``, ``settings`` and ``budget`` decide
    the next step's path, and the models are found in ``discovery`` (or from ``manual``'s
    parameters) before the first record. ``discovered(opt)`` is called after the first
    step, ``step_end(step)`` after each main one (on the lean path while ``ends_wanted``).
    """

    def __init__(self, state, optimizers, pre, forward, recorder, user_values, loaders, doctor, controls,
                 settings, budget, discovery, manual, discovered, step_end) -> None:
        self._state, self._optimizers, self._pre, self._forward = state, optimizers, pre, forward
        self._recorder, self._user_values, self._loaders, self._doctor = recorder, user_values, loaders, doctor
        self._controls, self._settings, self._budget = controls, settings, budget
        self._discovery, self._manual, self._discovered, self._step_end = discovery, manual, discovered, step_end
        self._found = False
        """Whether this process's first step ended (its models are known, ``discovered`` called)."""

    def period_changed(self) -> None:
        """The budget's period changed (flusher thread): a lean next step was decided under the
        old one, so the next step decides again."""
        self._state.lean = {}

    def post_step(self, opt, args, kwargs) -> None:
        """The global optimizer step post-hook, after every optimizer's update."""
        state = self._state
        lean = state.in_lean
        if lean is None and state.skipping is not None:  # a lean step without the pre-step hook
            lean = state.skipping.get(id(opt))
            if lean is None or lean.ref() is not opt or len(args) > 1 or kwargs:
                # An optimizer the lean steps did not expect (a new one), or a closure: the
                # full path records it (a closure's first loss), and the hook is back.
                self._pre.put_back()
                lean = None
                self._optimizers.track(opt).closure_losses = 0 if len(args) > 1 or kwargs else None
        if lean is not None:
            # The end of a lean step (see ``PreStep.pre_step``): nothing was sampled, timed or served,
            # so only the record, the counters and the next step's path are left. Written out
            # here, not in a method of its own: a call costs microseconds once a step, when
            # caches are cold.
            now = _perf_counter()
            state.in_lean = None
            losses = state.ended_losses = state.losses
            state.losses = []
            lrs = list(map(_LR, opt.param_groups))
            if (type(lrs[0]) is not float or len(lrs) > 1) and set(map(type, lrs)) != _FLOAT:
                lrs = _held(lrs)
            if lean.index:  # another optimizer's step, at the main step it follows
                record = _record((state.step, time.time(), losses, None, None, None, None, lrs, None,
                                  0, None, None, lean.index, 0.0, 0.0))
                if len(record) != RECORD_FIELDS:
                    raise RecordShapeError(record, RECORD_FIELDS)
                self._recorder.add(record)
                if lean.stepped_alone(state.step) >= HANDOVER_STEPS:  # it is the main one from its next step
                    self._optimizers.hand_over(lean)
                    self._pre.put_back()
                state.own += _perf_counter() - now
                return
            step = state.step + 1
            start = state.t_post
            user = self._user_values
            user = user.take() if user.pending else None
            t_record = _perf_counter()
            record = _record((step, time.time(), losses, None, None, None, None, lrs,
                              (start, None, None, now, None, 0.0), 0, None, user, 0,
                              state.own + t_record - now, 0.0))
            if len(record) != RECORD_FIELDS:
                raise RecordShapeError(record, RECORD_FIELDS)
            self._recorder.add(record)
            state.last_step_s = 0.9 * state.last_step_s + 0.1 * (now - start)
            if state.out_dirty:  # the script printed this step: its output is marked (outmarks.py)
                state.out_mark(step)
            state.step = step
            state.in_step = state.at_boundary = False
            state.t_post = now
            doctor = self._doctor
            if step >= doctor.post_from:
                doctor.on_post_step(opt, step)
            if state.ends_wanted:
                self._step_end(step)
            pending = self._controls.pending
            every = self._budget.every
            # Settings change only at a boundary the lean path did not take; a checkpoint can
            # fall due in ``_step_end``, and the doctor may watch the next step.
            if doctor.watching or pending.checkpoint or pending.stop is not None or not (step + 1) % every:
                self._next_step(opt, step)
            elif state.update_ratio_every and (step + 1) % state.update_ratio_every == 0:
                state.ratio_owed = True
            # A lean step after a lean step: the pre-step hook has nothing to do (prestep.py);
            # after micro-batches it would check the CPU ones, and be put back at each step.
            if state.lean and len(losses) < 2 and not self._controls.has_work(step):
                self._pre.take_off()
            else:
                self._pre.put_back()
            state.own = _perf_counter() - t_record
            return
        tracked = self._optimizers.by_id.get(id(opt))
        if tracked is None or tracked.ref() is not opt:
            return
        lrs = tracked.restore_lr()
        now = _perf_counter()
        losses = state.ended_losses = state.losses
        state.losses = []
        index = tracked.closure_losses
        if index is not None:  # a closure: the loss of its first evaluation
            losses = losses[index:index + 1] if len(losses) > index else losses[:index]
        if lrs is None:
            lrs = list(map(_LR, opt.param_groups))
        if set(map(type, lrs)) != _FLOAT:
            lrs = _held(lrs)
        per_tensor, total, params = tracked.norms if tracked.norms is not None else (None, None, None)
        clip_max, tracked.norms, tracked.clip_max = tracked.clip_max, None, None
        local = None
        if tracked.local:  # the local shards' total is not the total (sharded.py)
            local, total, tracked.local = {names.of_optimizer(tracked.index, names.GRAD_NORM_LOCAL): total}, None, False
        if tracked.index:
            record = _record((state.step, time.time(), losses, total, None, None, clip_max, lrs, None,
                              0, None, local, tracked.index, 0.0, 0.0))
            if len(record) != RECORD_FIELDS:
                raise RecordShapeError(record, RECORD_FIELDS)
            self._recorder.add(record)
            tracked.stepped_alone(state.step)
            state.own += _perf_counter() - now
            return
        self.end_step(opt, losses, total, per_tensor, params, clip_max, lrs, now, local)

    def end_step(self, opt, losses, total, per_tensor, params, clip_max, lrs, now: float, named=None) -> None:
        """Record the main step that just ended (``opt`` None: an inferred one) and get ready
        for the next; ``named``: values of the step's own by series name (a local norm)."""
        state = self._state
        step = state.step + 1
        ratios = None
        if state.before is not None:
            t0 = _perf_counter()
            ratios = metrics.update_ratio(state.before, metrics.ratio_samples(state.before_params))
            state.before = state.before_params = None
            state.extra += _perf_counter() - t0
        start = state.t_post if state.t_post is not None else now
        waits = self._loaders.take_waits() if self._loaders.timing else None
        if not self._found and not self._discovery.models:
            # Before the record: its layers are named after the models found here.
            self._discovery.set_models(find_models([opt]) if opt is not None else self._manual.models())
        user = self._user_values.take() if self._user_values.pending else None
        if named:
            user = {**user, **named} if user else named
        t_record = _perf_counter()
        record = _record((
            step, time.time(), losses, total, per_tensor, params if per_tensor is not None else None, clip_max, lrs,
            (start, state.t_forward, state.t_pre, now, waits, state.inner), state.samples, ratios, user, 0,
            state.own + t_record - now, state.extra))
        if len(record) != RECORD_FIELDS:
            raise RecordShapeError(record, RECORD_FIELDS)
        self._recorder.add(record)
        state.extra = 0.0
        step_s = now - start
        state.last_step_s = 0.9 * state.last_step_s + 0.1 * step_s if state.last_step_s else step_s
        doctor = self._doctor
        if step >= doctor.post_from:
            doctor.on_post_step(opt, step)
        if state.out_dirty:
            state.out_mark(step)
        state.step = step
        if self._optimizers.main is None:
            self._manual.backwards = 0
        state.in_step = state.at_boundary = False
        if state.clip_notes.notes:
            state.clip_notes.keep_for([t for t in self._optimizers.by_id.values() if t.index])
        state.t_post, state.t_forward, state.t_pre, state.inner, state.samples = now, None, None, 0.0, 0
        once = 0.0
        if not self._found:  # the first step of this process (a resumed run starts at N)
            self._found = True
            t_once = _perf_counter()
            self._discovered(opt)
            once = _perf_counter() - t_once  # start-up (naming layers, the schedule): not a step's cost
        self._step_end(step)
        self._next_step(opt, step)
        # What this step's end cost after its record is counted with the next step.
        state.own = _perf_counter() - t_record - once

    def _next_step(self, opt, step: int) -> None:
        """Get the hooks ready for step ``step + 1``: the forward hook, and its path."""
        state = self._state
        # The forward hook times the step's compute and serves checkpoints at the start of
        # a step: it is installed for the steps the doctor watches and when a save is due.
        doctor = self._doctor
        pending = self._controls.pending
        want = doctor.watching or bool(pending.checkpoint) or pending.stop is not None
        self._loaders.timing = doctor.watching
        if want is not self._forward.on:
            self._forward.set(want)
        settings, every = self._settings, self._budget.every
        lean = (opt is not None and (step + 1) % every != 0
                and not want and settings.clip is None and settings.lr_scale == 1.0)
        # Another optimizer's step after this one is sampled with the next main step (both
        # read ``state.step + 1``), so the same decision holds for it.
        state.lean = dict(self._optimizers.by_id) if lean else {}
        if every != self._budget.every:  # the flusher changed it meanwhile: decide at the step
            state.lean = {}
        if state.update_ratio_every and (step + 1) % state.update_ratio_every == 0:
            state.ratio_owed = True  # taken at the next sampled step
