"""Gradients that are never cleared, and gradients cleared before the optimizer used them.

- ``grads-never-cleared``: each watched step's first backward compares one sample
  parameter's ``.grad`` (object and version, kept current by a post-accumulate hook)
  with what the previous step left; the flush confirms the carried gradient was non-zero
  (a ``.data.zero_()`` does not show in the version, and reading the norm on the
  training thread would be a host sync).
- ``zero-grad-before-step``: a relevant ``zero_grad`` after the step's last backward:
  ``None`` gradients at once, all-zero ones from the flush's per-layer norms.
"""

from __future__ import annotations

import collections
import logging
import weakref
from typing import Callable

import torch

from .sources import caller, quoted

log = logging.getLogger("ptdash.doctor")

CARRY_STEPS = 3
"""Steps that must carry the previous step's gradient before grads-never-cleared is reported."""


class Gradients:
    """The two gradient-clearing rules, for one main optimizer at a time.

    ``report(rule, what, **data)`` raises a finding; ``names(params)`` names parameters.
    """

    def __init__(self, report: Callable[..., None], names: Callable[[list], list[str]]) -> None:
        self._report, self._names = report, names
        # Flusher thread: candidates it confirms.
        self._carry_queue: collections.deque = collections.deque()
        self._zero_queue: collections.deque = collections.deque()
        self._zero_candidates: dict[int, str | None] = {}
        self._carried: list[int] = []
        self.found_carry = False
        # Training thread: what happened since the main optimizer's last step.
        self._backwards = 0
        self._cleared = False
        self._carry_norm: torch.Tensor | None = None
        self._zeroed_after: str | None = None
        self.reset(None)

    def reset(self, opt) -> None:
        """A new main optimizer: follow a parameter of its own (what this step saw still counts)."""
        self.stop()
        self._opt_name = type(opt).__name__ if opt is not None else "the optimizer"
        self.sample: torch.Tensor | None = None
        """One parameter whose .grad tells whether gradients were cleared between steps."""
        self._holds_sample: dict[int, bool] = {}
        self._base: tuple[weakref.ref | None, int] = (None, -1)

    def stop(self) -> None:
        handle = getattr(self, "_sample_handle", None)
        if handle is not None:
            handle.remove()
        self._sample_handle = None

    # -------------------------------------------------------------- training thread

    def on_backward(self) -> None:
        self._backwards += 1
        self._zeroed_after = None  # gradients computed after a clearing are real again
        sample = self.sample
        if sample is None or self._cleared:
            return
        grad = sample.grad
        ref, version = self._base
        if grad is None or ref is None or grad is not ref() or grad._version != version:
            self._cleared = True  # set to None, replaced or zeroed in place since the last look
        elif self._carry_norm is None:
            # This backward adds to the previous step's gradient; whether that was non-zero
            # is read at the flush: no sync.
            self._carry_norm = torch.linalg.vector_norm(grad.detach())

    def on_zero_grad(self, owner, main) -> None:
        """``zero_grad`` on an optimizer or module; ``main`` is the main optimizer (or None)."""
        if isinstance(owner, torch.optim.Optimizer) and main is not None and owner is not main:
            if id(owner) not in self._holds_sample:
                self._holds_sample[id(owner)] = self.sample is not None and any(
                    p is self.sample for g in owner.param_groups for p in g["params"])
            if not self._holds_sample[id(owner)]:
                return  # another model's optimizer
        self._cleared = True
        if self._backwards:
            self._zeroed_after = caller() or ""

    def sample_state(self):
        """What a module's zero_grad may change: the sample's gradient object and version."""
        grad = self.sample.grad if self.sample is not None else None
        return None if grad is None else (id(grad), grad._version)

    def on_pre_step(self, step: int, params_with_grad: list) -> None:
        if self.sample is None and params_with_grad:
            self.sample = params_with_grad[0]
            self._watch_sample()
        if self._backwards:
            if not params_with_grad:
                self._report_zeroed(step, self._zeroed_after, "no gradients at all (every .grad was None)")
            elif self._zeroed_after is not None:
                self._zero_queue.append((step, self._zeroed_after))
            elif not self._cleared and self._carry_norm is not None:
                self._carry_queue.append((step, self._carry_norm, caller()))

    def on_post_step(self, watch_next: bool) -> None:
        """After a step: get ready to watch the next one, or stop following the sample."""
        if watch_next:
            grad = self.sample.grad if self.sample is not None else None
            self._base = (weakref.ref(grad), grad._version) if grad is not None else (None, -1)
            self._backwards = 0
            self._cleared = False
            self._carry_norm = None
            self._zeroed_after = None
            if self._sample_handle is None and self.sample is not None:
                self._watch_sample()
        else:
            self.stop()

    def _watch_sample(self) -> None:
        """Follow the sample's gradient across the backwards of a watched step."""
        if self.sample.requires_grad and self.sample.is_leaf:
            self._sample_handle = self.sample.register_post_accumulate_grad_hook(self._after_accumulate)

    def _after_accumulate(self, param) -> None:
        grad = param.grad
        self._base = (weakref.ref(grad), grad._version) if grad is not None else (None, -1)

    def _report_zeroed(self, step: int, source: str | None, seen: str) -> None:
        by = f"zero_grad() at {quoted(source)}" if source else "a zero_grad() or `.grad = None`"
        self._report("zero-grad-before-step", f"step {step}: backward() ran, then {by} cleared the gradients "
                     f"before {self._opt_name}.step(), which saw {seen}", step=step, source=source)

    # --------------------------------------------------------------- flusher thread

    def on_flush(self, layer_rows: list, to_host: Callable[[list], list]) -> None:
        for check in (lambda: self._confirm_carry(to_host), lambda: self._confirm_zeroed(layer_rows)):
            try:
                check()
            except Exception:
                log.exception("doctor flush check failed")

    def _confirm_carry(self, to_host) -> None:
        items = []
        while self._carry_queue:
            items.append(self._carry_queue.popleft())
        if not items or self.found_carry:
            return
        for (step, _, source), norm in zip(items, to_host([norm.reshape(()) for _, norm, _ in items])):
            if norm is not None and norm > 0:
                self._carried.append(step)
            if len(self._carried) >= CARRY_STEPS:
                self.found_carry = True
                name = self._names([self.sample])[0] if self.sample is not None else "a parameter"
                self._report("grads-never-cleared", f"{self._opt_name}.step() at {quoted(source)} ran at steps "
                             f"{self._carried[0]}-{self._carried[-1]} with no zero_grad() in between: `{name}` still "
                             f"held the previous step's gradient (norm {norm:.3g}) when the next backward() added "
                             f"to it", step=self._carried[0], source=source, steps=len(self._carried), param=name)
                return

    def _confirm_zeroed(self, layer_rows: list) -> None:
        while self._zero_queue:
            step, source = self._zero_queue.popleft()
            self._zero_candidates[step] = source
        for row in layer_rows if self._zero_candidates else ():
            source = self._zero_candidates.pop(row.step, False)
            if source is not False and row.grad_norms and all(n == 0.0 for n in row.grad_norms):
                self._report_zeroed(row.step, source, "all-zero gradients")
        if layer_rows:  # a candidate whose step left no per-layer row cannot be confirmed
            self._zero_candidates = {s: v for s, v in self._zero_candidates.items() if s > layer_rows[-1].step}
