"""Steps of a script that updates its parameters itself, with no ``torch.optim`` optimizer.

PyTorch's own tutorials train this way: ``model.zero_grad()``, ``loss.backward()``, then
``p -= lr * p.grad`` under ``no_grad``. No optimizer hook fires, so the step boundary is
inferred from the cycle the gradients go through: the leaf tensors the first loss
reaches are the parameters, and a backward that finds them cleared since the previous
one (set to None, replaced, or zeroed in place) starts a new step; one that finds them
as the previous backward left them is accumulating into the same step. The norms of a
step are taken after each of its backwards (the last one's count), because by the time
the next step begins the script has cleared them: on the steps the cost budget samples
(budget.py), and on every step when the script clips (its clip measures them) or the
live clip needs them. The other steps check their loss before the update.
"""

from __future__ import annotations

import math
import time

import torch

from . import metrics
from .discovery import find_models

_perf_counter = time.perf_counter

BACKWARDS_WITHOUT_A_STEP = 500
"""Backward calls without any step (optimizer or inferred) after which ptdash says so."""


def leaf_tensors(loss: torch.Tensor) -> list[torch.Tensor]:
    """The leaf tensors ``loss``'s graph accumulates gradients into, in graph order."""
    out: list[torch.Tensor] = []
    seen: set = set()
    stack = [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        variable = getattr(node, "variable", None)  # AccumulateGrad nodes hold their leaf
        if isinstance(variable, torch.Tensor):
            out.append(variable)
            continue
        stack.extend(next_node for next_node, _ in reversed(node.next_functions))
    return out


class ManualSteps:
    """Infers the step boundary of optimizer-less training from the gradients' cycle."""

    def __init__(self) -> None:
        self.params: list[torch.Tensor] | None = None
        """The leaf tensors the first loss reached (the parameters being trained)."""
        self.active = False
        """True once a step has been inferred (and no optimizer has stepped since)."""
        self._after: tuple[int, int] | None = None
        """The sample gradient's (object id, version) as the latest backward left it."""
        self.backwards = 0
        """Backward calls since the latest step of any kind."""
        self.noticed = False
        self.norms: tuple | None = None
        """(per-parameter norms, total, parameters) after the step's latest backward, pre-clip."""
        self.script_clips = False
        """Whether the script clipped in its latest step (then the clip override is its call's)."""

    def starts_step(self, loss: torch.Tensor) -> bool:
        """Before a backward (while no optimizer steps): does it begin a new step?

        True when the gradients were cleared since the previous backward: the previous
        step ended.
        """
        if self.params is None:
            self.params = leaf_tensors(loss)
            return False
        if not self.params or self._after is None:
            return False
        grad = self.params[0].grad
        return grad is None or (id(grad), grad._version) != self._after

    def sync(self) -> None:
        """Remember how the backward (and ptdash's own clip) left the sample gradient: a
        change made by ptdash is not a clearing."""
        if self.params:
            grad = self.params[0].grad
            self._after = None if grad is None else (id(grad), grad._version)

    def order(self, models: list[torch.nn.Module]) -> None:
        """Put the parameters in their models' order (the Layers tab's), once models are known."""
        if not self.params or not models:
            return
        wanted = {id(p): p for p in self.params}
        ordered = [p for m in models for p in m.parameters() if wanted.pop(id(p), None) is not None]
        self.params = ordered + list(wanted.values())

    def models(self) -> list[torch.nn.Module]:
        """The models owning the parameters."""
        if not self.params:
            return []
        holder = torch.optim.SGD.__new__(torch.optim.SGD)  # find_models reads only param_groups
        holder.param_groups = [{"params": self.params}]
        return find_models([holder])

    def after_backward(self, settings, sampled: bool, losses: list) -> tuple | None:
        """After a backward, before the script's own update: the step's norms so far (on the
        steps the cost budget samples, and whenever the live clip needs them), the clip
        override, the finite check. ``(per-parameter norms or None, params)`` when the step
        is not finite (on CPU: exact), else None. The caller then calls ``sync``.

        On a step the budget does not sample only the latest loss is checked, as on an
        optimizer's lean path (prestep.py); the script's own clip, if it clips, gives the
        step's norms anyway (``end_of_step``).
        """
        params = [p for p in self.params or () if p.grad is not None]
        if not params:
            return None
        clip = settings.clip if not self.script_clips else None
        if sampled or clip is not None:
            per_tensor, total = metrics.grad_norms([p.grad for p in params])
            self.norms = (per_tensor, total, params)
            if clip is not None:
                metrics.clip_with_norm(params, clip, total)
            if self.active and total.is_cpu and not math.isfinite(total.item()):
                return per_tensor, params
            return None
        self.norms = None
        loss = losses[-1] if losses else None
        if self.active and loss is not None and loss.is_cpu and not math.isfinite(loss.item()):
            return None, params
        return None

    def end_of_step(self, clip_notes: list, settings) -> tuple:
        """The step that just ended: ``(per-parameter norms, total, params, clip in force)``.

        The norms are those after its latest backward, or on a step that took none, those
        the script's own clip measured (before clipping, as the backward's would be).
        """
        self.active = True
        note = clip_notes[-1] if clip_notes else None
        self.script_clips = note is not None
        clip_max = note[3] if note is not None else settings.clip
        norms, self.norms = self.norms, None
        if norms is None and note is not None and note[1] is not None:
            norms = (note[1], note[2], note[0])
        return (*(norms or (None, None, None)), clip_max)

    def count_backward(self) -> bool:
        """Count a backward; True once, when many ran and no step of any kind was seen."""
        self.backwards += 1
        if not self.noticed and self.backwards >= BACKWARDS_WITHOUT_A_STEP and not self.active:
            self.noticed = True
            return True
        return False


class InferredSteps:
    """The steps of a script with no optimizer: the backward wrapper (wrappers.py) calls these
    on its backwards, and the engine ``end_manual_step`` at its end.

    The step boundary is inferred by ``manual`` (the ManualSteps every part shares); a step
    that ended is recorded by ``end`` (stepend.py) and its boundary served by ``pre``
    (prestep.py), in the shared per-step ``state`` (stepstate.py). ``optimizers`` says
    whether an optimizer stepped, ``discovery`` whether the script made one; ``settings``,
    ``budget`` and ``anomalies`` give the live clip, the sampled steps and what a
    non-finite step does; the ``doctor`` is told once when many backwards ran and no step
    of any kind was seen, and the ``controls`` once when the first inferred step ended (an
    LR factor cannot act on it).
    """

    def __init__(self, state, manual, optimizers, pre, end, discovery, settings, budget, anomalies, doctor,
                 controls) -> None:
        self._state, self.manual, self._optimizers, self._pre, self._end = state, manual, optimizers, pre, end
        self._discovery, self._settings, self._budget, self._anomalies = discovery, settings, budget, anomalies
        self._doctor, self._controls = doctor, controls
        self._first = True

    def optimizer_less(self) -> bool:
        """Whether the script made no torch.optim optimizer (a skipped one still counts)."""
        return not self._discovery.live(self._discovery.optimizers)

    def manual_boundary(self) -> None:
        """An inferred step ended (the script cleared its gradients since the last backward)."""
        self._record_step()
        if self._first:
            self._first = False
            self._controls.without_optimizer()
        self._pre.boundary()

    def end_manual_step(self) -> None:
        """The script ended: no next backward will end its last inferred step."""
        if self.manual.active and self._optimizers.main is None and self._state.losses:
            self._record_step()

    def _record_step(self) -> None:
        state = self._state
        per_tensor, total, params, clip_max = self.manual.end_of_step(state.clip_notes.notes, self._settings)
        self._end.end_step(None, state.losses, total, per_tensor, params, clip_max, [], _perf_counter())
        state.losses = []

    def after_manual_backward(self) -> None:
        """After a backward of an optimizer-less script: its norms, clip and finite check,
        timed as ptdash's own (the norm pass as the sampled part, budget.py)."""
        state = self._state
        t0 = _perf_counter()
        manual, step = self.manual, state.step
        sampled = (step + 1) % self._budget.every == 0
        bad = manual.after_backward(self._settings, sampled, state.losses)
        paused = 0.0
        if bad is not None:  # may pause: not ptdash's time
            t_bad = _perf_counter()
            self._anomalies.before_manual_update(step + 1, *bad)
            paused = _perf_counter() - t_bad
        manual.sync()
        spent = _perf_counter() - t0 - paused
        state.own += spent
        if manual.norms is not None:
            state.extra += spent

    def note_backward_without_step(self) -> None:
        """Count a backward while no step of any kind is known (the doctor says so once)."""
        if self.manual.count_backward():  # many backwards, no step of any kind: say so once
            self._doctor.report("no-step", f"{self.manual.backwards} backward() calls and no step: no torch.optim "
                                "optimizer stepped, and the gradients were never cleared between backward() calls")
