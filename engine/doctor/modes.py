"""Parts of the model that do not train: training in eval mode, parameters that never learn.

- ``train-in-eval-mode``: the model (with Dropout or BatchNorm) is in eval mode on two
  watched steps in a row, naming where ``eval()`` was called;
- ``never-learns``: frozen parameters handed to the optimizer (``/frozen``), parameters
  that never get a gradient (``/no-grad``), and the same named after DDP's
  unused-parameter error.

Host attributes only: nothing here reads the device.
"""

from __future__ import annotations

import collections
import sys
from typing import Callable

from torch import nn

from ..discovery import unwrap
from .sources import caller, name_list, quoted

NEVER_LEARNS_STEPS = 50
"""Steps after which a parameter that never had a gradient is reported."""


class Modes:
    """The two rules, for one main optimizer at a time; ``models()`` gives the current models."""

    def __init__(self, report: Callable[..., None], names: Callable[[list], list[str]],
                 models: Callable[[], list]) -> None:
        self._report, self._names, self._models = report, names, models
        self._eval_sources: dict[int, str | None] = {}
        """Module id -> the user's line that called eval() on it (until train())."""
        self.reset(None, 0)

    def reset(self, opt, step: int) -> None:
        """A new main optimizer: check what it was given, start counting again."""
        self._opt_name = type(opt).__name__ if opt is not None else "the optimizer"
        self._nograd: list | None = None
        self._eval_steps = 0
        self._modes: dict[int, list] = {}
        self._roots: tuple[list | None, list] = (None, [])
        if opt is not None:
            self._check_frozen(opt, step)

    def on_pre_step(self, opt, step: int, params_with_grad: list) -> None:
        if params_with_grad:
            self._check_nograd(opt, step)
        if step > 1:
            self._check_modes(step)

    def on_ddp_unused_error(self, opt, source: str | None) -> None:
        """DDP raised its unused-parameter error: name the parameters that got no gradient."""
        if self._nograd:
            self._report_nograd(self._nograd, opt, "before DistributedDataParallel's error", source=source)

    def wrap_train(self, original):
        """``nn.Module.train`` that remembers where the outermost ``eval()`` was called."""
        sources, code = self._eval_sources, original.__code__

        def train(module, mode=True):
            result = original(module, mode)
            if sys._getframe(1).f_code is not code:  # the outermost call, not a child's
                if mode:
                    sources.pop(id(module), None)
                else:
                    sources[id(module)] = caller()
            return result

        train.__wrapped__ = original
        return train

    def _check_frozen(self, opt, step: int) -> None:
        frozen = [p for g in opt.param_groups for p in g["params"] if not p.requires_grad]
        if frozen:
            names = self._names(frozen)
            self._report("never-learns", f"{len(frozen)} parameter(s) with requires_grad=False were given to "
                         f"{type(opt).__name__}: {name_list(names)}", key="never-learns/frozen",
                         case="frozen", step=step, params=names[:50], count=len(frozen))

    def _check_nograd(self, opt, step: int) -> None:
        if self._nograd is None:
            self._nograd = [p for g in opt.param_groups for p in g["params"] if p.requires_grad and p.grad is None]
        elif self._nograd:  # empty from the first step on in a healthy loop: no cost
            self._nograd = [p for p in self._nograd if p.grad is None]
        if self._nograd and step >= NEVER_LEARNS_STEPS:
            self._report_nograd(self._nograd, opt, f"in {step} steps", step=step)
            self._nograd = []

    def _report_nograd(self, params: list, opt, seen: str, **data) -> None:
        names = self._names(params)
        self._report("never-learns", f"{len(params)} parameter(s) with requires_grad=True never received a "
                     f"gradient {seen}: {name_list(names)}", key="never-learns/no-grad", case="no-grad",
                     params=names[:50], count=len(params), **data)

    def _check_modes(self, step: int) -> None:
        models = self._models()
        if self._roots[0] is not models:  # unwrap() costs microseconds: once per model list
            self._roots = (models, [(m, unwrap(m)) for m in models])
        in_eval = None
        for model, root in self._roots[1]:
            if root.training:
                continue
            layers = self._modes.get(id(root))
            if layers is None:
                layers = self._modes[id(root)] = [
                    (name, m) for name, m in root.named_modules()
                    if isinstance(m, nn.modules.batchnorm._BatchNorm)
                    or (isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0)]
            if layers and not any(m.training for _, m in layers):
                in_eval = (model, root, layers)
                break
        self._eval_steps = self._eval_steps + 1 if in_eval else 0
        if in_eval is None or self._eval_steps < 2:
            return  # two steps in a row: not a one-off evaluation inside a step
        model, root, layers = in_eval
        kinds = collections.Counter(type(m).__name__ for _, m in layers)
        source = self._eval_sources.get(id(root)) or self._eval_sources.get(id(model))
        self._report("train-in-eval-mode", f"{type(root).__name__} is in eval mode while {self._opt_name}.step() "
                     f"trains it (step {step}); it has {', '.join(f'{n} {k}' for k, n in kinds.items())} "
                     f"({name_list([n for n, _ in layers], 3)})"
                     + (f"; eval() was called at {quoted(source)}" if source else ""),
                     step=step, module=type(root).__name__, source=source)
