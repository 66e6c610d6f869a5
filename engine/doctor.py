"""The training doctor: live detection of the classic silent PyTorch bugs.

Each rule raises a finding once, with what was seen, why it matters and the fix (the
texts are in ``doctor_rules.RULES``). The engine calls the ``on_*`` methods from its
hooks; they stay cheap: no host sync on a GPU, anything that needs device values is
confirmed at the flush, on the host. Where each rule is decided:

- ``grads-never-cleared``: ``on_backward`` compares one sample parameter's ``.grad``
  (object and version, kept current by a post-accumulate hook) with what the last step
  left; the flusher confirms that the gradient carried over was non-zero.
- ``zero-grad-before-step``: a relevant ``zero_grad`` after the step's last backward:
  ``None`` gradients at once, all-zero ones from the flush's per-layer norms.
- ``train-in-eval-mode``, ``never-learns``: host attributes at ``on_pre_step``.
- ``inplace-autograd``: ``on_crash``; ``detect_anomaly`` in the config turns anomaly mode on.
- ``host-syncs`` (CUDA only), ``sampler-no-set-epoch``, ``dataparallel``, ``input-bound``,
  ``lr-zero``, ``loss-plateau``: see ``doctor_rules``.
- The script's Python warnings become ``warning`` events, each distinct one once.

The training-thread checks run on the steps ``watches()`` picks (every step at first,
then one in WATCH_EVERY), so a healthy loop pays for them on a few steps only.
"""

from __future__ import annotations

import collections
import logging
import sys
import threading
import weakref
from typing import Any

import torch
from torch import nn

from . import checkpoint
from . import doctor_rules as rules
from .patching import Patches

log = logging.getLogger("ptdash.doctor")

NEVER_LEARNS_STEPS = 50
"""Steps after which a parameter that never had a gradient is reported."""
CARRY_STEPS = 3
"""Steps that must carry the previous step's gradient before grads-never-cleared is reported."""
MAX_WARNINGS = 50
"""Distinct Python warnings recorded per run; later ones are only counted."""
WATCH_FIRST = 64
WATCH_EVERY = 16
"""The training-thread checks watch every step up to WATCH_FIRST (past NEVER_LEARNS_STEPS),
then every WATCH_EVERY-th: the bugs they look for repeat every step, and a step not
watched costs them nothing."""


def watches(step: int) -> bool:
    """Whether the training-thread checks watch step ``step`` (counted from 1)."""
    return step <= WATCH_FIRST or step % WATCH_EVERY == 0


class Doctor:
    """Receives the engine's hook calls and reports findings through ``engine.event``."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self._lock = threading.Lock()
        self._reported: set[str] = set()
        self._patches = Patches()
        self._cuda = False
        self._anomaly: tuple[bool, Any] | None = None
        self._anomaly_trace = ""
        self._warnings_seen: set[tuple[str, str]] = set()
        self.warnings_dropped = 0
        self.data = rules.DataWatch(self.report, lambda: self.engine.hooks.step)
        self.syncs = rules.SyncSampler()
        # Flusher thread: row detectors and the candidates it confirms.
        self._lr_zero, self._plateau, self._input = rules.LrZero(), rules.Plateau(), rules.InputBound()
        self._carry_queue: collections.deque = collections.deque()
        self._zero_queue: collections.deque = collections.deque()
        self._zero_candidates: dict[int, str | None] = {}
        self._carried: list[int] = []
        # Training thread: what happened since the main optimizer's last step.
        self._backwards = 0
        self._cleared = False
        self._carry_norm: torch.Tensor | None = None
        self._zeroed_after: str | None = None
        self._eval_sources: dict[int, str | None] = {}
        self._sample_handle = None
        self.watching = True
        """Whether the hooks call ``on_backward``, ``on_zero_grad`` and ``on_pre_step`` this step."""
        self.post_from = 0
        """The hooks call ``on_post_step`` after each step from this one on (it moves ahead
        while no step is watched)."""
        self._reset(None)

    def _reset(self, opt) -> None:
        """Per-optimizer state: a new main optimizer starts over."""
        if self._sample_handle is not None:
            self._sample_handle.remove()
        self._main = weakref.ref(opt) if opt is not None else None
        self._opt_name = type(opt).__name__ if opt is not None else "the optimizer"
        self._sample: torch.Tensor | None = None
        """One parameter whose .grad tells whether gradients were cleared between steps."""
        self._sample_handle = None
        self._holds_sample: dict[int, bool] = {}
        self._base: tuple[weakref.ref | None, int] = (None, -1)
        self._nograd: list | None = None
        self._eval_steps = 0
        self._modes: dict[int, list] = {}
        self._roots: tuple[list | None, list] = (None, [])

    # ------------------------------------------------------------ attach / detach

    def attach(self) -> None:
        """Install the doctor's own patches (called once, before the script runs)."""
        import warnings

        self._cuda = torch.cuda.is_available()
        self._patch(warnings, "showwarning", self._wrap_showwarning(warnings.showwarning))
        self._patch(nn.Module, "zero_grad", self._wrap_module_zero_grad(nn.Module.zero_grad))
        self._patch(nn.Module, "train", self._wrap_train(nn.Module.train))
        for owner, name, when, callback in self.data.patches():
            self._patch(owner, name, _call(getattr(owner, name), when, callback))
        if self.engine.config.detect_anomaly:
            # Slow (a stack trace per forward op), so only on request: it names the forward
            # op whose saved tensor an in-place operation overwrote.
            before = torch.is_anomaly_enabled()
            torch.autograd.set_detect_anomaly(True)
            warnings.filterwarnings("always", message="Error detected in")
            self._anomaly = (before, warnings.filters[0])
            self.engine.event("run", "anomaly detection on (--detect-anomaly): backward is slower")

    def detach(self) -> None:
        """Undo ``attach``."""
        self.syncs.stop()
        if self._sample_handle is not None:
            self._sample_handle.remove()
            self._sample_handle = None
        if self._anomaly is not None:
            torch.autograd.set_detect_anomaly(self._anomaly[0])
            rules.remove_filter(self._anomaly[1])
            self._anomaly = None
        self._patches.undo()

    def _patch(self, owner: Any, name: str, replacement: Any) -> None:
        self._patches.set(owner, name, replacement)

    # ----------------------------------------------------------------- reporting

    def report(self, rule: str, what: str, why: str | None = None, fix: str | None = None,
               key: str | None = None, **data) -> None:
        """Raise finding ``rule`` once per ``key`` (default: the rule id); texts from RULES."""
        key = key or rule
        with self._lock:
            if key in self._reported:
                return
            self._reported.add(key)
        entry = rules.RULES.get(key, rules.RULES[rule])
        self.engine.event("finding", f"{rule}: {what}", id=rule, what=what, why=why or entry.why,
                          fix=fix or entry.fix, severity=entry.severity, **data)

    def _names(self, params: list, opt=None) -> list[str]:
        models = list(self.engine.hooks.models) or (checkpoint.find_models([opt]) if opt is not None else [])
        by_id: dict[int, str] = {}
        for model in models:
            for name, p in checkpoint.unwrap(model).named_parameters():
                by_id.setdefault(id(p), name)
        return [by_id.get(id(p), f"{type(p).__name__}{tuple(p.shape)}") for p in params]

    # --------------------------------------------------------- training-thread hooks

    def on_backward(self) -> None:
        """A backward pass ran (training thread)."""
        try:
            self._backwards += 1
            self._zeroed_after = None  # gradients computed after a clearing are real again
            sample = self._sample
            if sample is None or self._cleared:
                return
            grad = sample.grad
            ref, version = self._base
            if grad is None or ref is None or grad is not ref() or grad._version != version:
                self._cleared = True  # set to None, replaced or zeroed in place since the last look
            elif self._carry_norm is None:
                # This backward adds to the previous step's gradient. Whether that was non-zero
                # (a .data.zero_() does not show in the version) is read at the flush: no sync.
                self._carry_norm = torch.linalg.vector_norm(grad.detach())
        except Exception:
            log.exception("doctor check failed")

    def _watch_sample(self) -> None:
        """Follow the sample's gradient across the backwards of a watched step."""
        if self._sample.requires_grad and self._sample.is_leaf:
            self._sample_handle = self._sample.register_post_accumulate_grad_hook(self._after_accumulate)

    def _after_accumulate(self, param) -> None:
        grad = param.grad
        self._base = (weakref.ref(grad), grad._version) if grad is not None else (None, -1)

    def on_zero_grad(self, owner) -> None:
        """``zero_grad`` was called on an optimizer or module (training thread)."""
        try:
            main = self._main() if self._main is not None else None
            if isinstance(owner, torch.optim.Optimizer) and main is not None and owner is not main:
                if id(owner) not in self._holds_sample:
                    self._holds_sample[id(owner)] = self._sample is not None and any(
                        p is self._sample for g in owner.param_groups for p in g["params"])
                if not self._holds_sample[id(owner)]:
                    return  # another model's optimizer
            self._cleared = True
            if self._backwards:
                self._zeroed_after = rules.caller() or ""
        except Exception:
            log.exception("doctor check failed")

    def _wrap_module_zero_grad(self, original):
        doctor = self

        def zero_grad(module, *args, **kwargs):
            before = doctor._sample_state()
            result = original(module, *args, **kwargs)
            if doctor._sample is None or doctor._sample_state() != before:
                doctor.on_zero_grad(module)
            return result

        zero_grad.__wrapped__ = original
        return zero_grad

    def _sample_state(self):
        grad = self._sample.grad if self._sample is not None else None
        return None if grad is None else (id(grad), grad._version)

    def on_pre_step(self, opt, step: int, params_with_grad: list) -> None:
        """Before the update of step ``step`` of the main optimizer, gradients final."""
        try:
            self._pre_step(opt, step, params_with_grad)
        except Exception:
            log.exception("doctor check failed")

    def _pre_step(self, opt, step: int, params_with_grad: list) -> None:
        if self._main is None or self._main() is not opt:
            self._reset(opt)
            self._check_frozen(opt, step)
        if self._sample is None and params_with_grad:
            self._sample = params_with_grad[0]
            self._watch_sample()
        if self._backwards:
            if not params_with_grad:
                self._report_zeroed(step, self._zeroed_after, "no gradients at all (every .grad was None)")
            elif self._zeroed_after is not None:
                self._zero_queue.append((step, self._zeroed_after))
            elif not self._cleared and self._carry_norm is not None:
                self._carry_queue.append((step, self._carry_norm, rules.caller()))
        if params_with_grad:
            self._check_nograd(opt, step)
        if step > 1:
            self._check_modes(step)

    def on_post_step(self, opt, step: int) -> None:
        """After the update of step ``step``: decides whether the next step is watched.

        The hooks call it from step ``post_from`` on: every step while watching (or on
        CUDA, for the sync sampler), else only before the next watched step.
        """
        try:
            if self._main is None or self._main() is not opt:
                return
            watch = watches(step + 1)
            if watch:
                grad = self._sample.grad if self._sample is not None else None
                self._base = (weakref.ref(grad), grad._version) if grad is not None else (None, -1)
                self._backwards = 0
                self._cleared = False
                self._carry_norm = None
                self._zeroed_after = None
                if self._sample_handle is None and self._sample is not None:
                    self._watch_sample()
            elif self._sample_handle is not None:
                self._sample_handle.remove()
                self._sample_handle = None
            self.watching = watch
            if watch or self._cuda:
                self.post_from = step + 1
            else:  # nothing to do until the step before the next watched one
                self.post_from = ((step + 1) // WATCH_EVERY + 1) * WATCH_EVERY - 1
            if self._cuda and (self.syncs.active or torch.cuda.is_initialized()):
                found = self.syncs.on_post_step(step)
                if found:
                    lines = "; ".join(f"{rules.quoted(x['source'])} x{x['per_step']}" for x in found["lines"][:5])
                    self.report("host-syncs", f"{found['per_step']} device-to-host sync(s) per step (sampled steps "
                                f"{found['steps'][0]} and {found['steps'][1]}): {lines}",
                                step=found["steps"][1], source=found["lines"][0]["source"], lines=found["lines"][:10])
        except Exception:
            log.exception("doctor check failed")
            self._cuda = False
            self.syncs.stop()

    # ------------------------------------------------------------------ the rules

    def _report_zeroed(self, step: int, source: str | None, seen: str) -> None:
        by = f"zero_grad() at {rules.quoted(source)}" if source else "a zero_grad() or `.grad = None`"
        self.report("zero-grad-before-step", f"step {step}: backward() ran, then {by} cleared the gradients "
                    f"before {self._opt_name}.step(), which saw {seen}", step=step, source=source)

    def _check_frozen(self, opt, step: int) -> None:
        frozen = [p for g in opt.param_groups for p in g["params"] if not p.requires_grad]
        if frozen:
            names = self._names(frozen, opt)
            self.report("never-learns", f"{len(frozen)} parameter(s) with requires_grad=False were given to "
                        f"{type(opt).__name__}: {rules.name_list(names)}", key="never-learns/frozen",
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
        names = self._names(params, opt)
        self.report("never-learns", f"{len(params)} parameter(s) with requires_grad=True never received a "
                    f"gradient {seen}: {rules.name_list(names)}", key="never-learns/no-grad", case="no-grad",
                    params=names[:50], count=len(params), **data)

    def _check_modes(self, step: int) -> None:
        models = self.engine.hooks.models
        if self._roots[0] is not models:  # unwrap() costs microseconds: once per model list
            self._roots = (models, [(m, checkpoint.unwrap(m)) for m in models])
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
        self.report("train-in-eval-mode", f"{type(root).__name__} is in eval mode while {self._opt_name}.step() "
                    f"trains it (step {step}); it has {', '.join(f'{n} {k}' for k, n in kinds.items())} "
                    f"({rules.name_list([n for n, _ in layers], 3)})"
                    + (f"; eval() was called at {rules.quoted(source)}" if source else ""),
                    step=step, module=type(root).__name__, source=source)

    def _wrap_train(self, original):
        doctor, code = self, original.__code__

        def train(module, mode=True):
            result = original(module, mode)
            if sys._getframe(1).f_code is not code:  # the outermost call, not a child's
                if mode:
                    doctor._eval_sources.pop(id(module), None)
                else:
                    doctor._eval_sources[id(module)] = rules.caller()
            return result

        train.__wrapped__ = original
        return train

    def _wrap_showwarning(self, original):
        doctor = self

        def showwarning(message, category, filename, lineno, file=None, line=None):
            if doctor.syncs.on_warning(message, sys._getframe(1)):
                return None
            try:
                doctor._on_warning(message, category, filename, lineno)
            except Exception:
                log.exception("warning capture failed")
            return original(message, category, filename, lineno, file, line)

        showwarning.__wrapped__ = original
        return showwarning

    def _on_warning(self, message, category, filename, lineno) -> None:
        text = str(message)
        if "Error detected in" in text and "Traceback of forward call" in text:
            self._anomaly_trace = text
        with self._lock:
            if (category.__name__, text) in self._warnings_seen:
                return
            if len(self._warnings_seen) >= MAX_WARNINGS:
                self.warnings_dropped += 1
                return
            self._warnings_seen.add((category.__name__, text))
        source = f"{rules.short_path(filename)}:{lineno}"
        first = (text.strip().splitlines() or [""])[0]
        self.engine.event("warning", f"{category.__name__}: {first} ({source})", origin="python",
                          category=category.__name__, text=text[:2000], source=source)

    # ---------------------------------------------------------------- flusher thread

    def on_flush(self, rows: list, layer_rows: list) -> None:
        """Host values of the steps since the previous flush (flusher thread)."""
        for check, arg in ((self._confirm_carry, None), (self._confirm_zeroed, layer_rows), (self._check_rows, rows)):
            try:
                check(arg)
            except Exception:
                log.exception("doctor flush check failed")

    def _confirm_carry(self, _) -> None:
        from .recorder import _to_host

        items = []
        while self._carry_queue:
            items.append(self._carry_queue.popleft())
        if not items or "grads-never-cleared" in self._reported:
            return
        for (step, _, source), norm in zip(items, _to_host([norm.reshape(()) for _, norm, _ in items])):
            if norm is not None and norm > 0:
                self._carried.append(step)
            if len(self._carried) >= CARRY_STEPS:
                name = self._names([self._sample])[0] if self._sample is not None else "a parameter"
                self.report("grads-never-cleared", f"{self._opt_name}.step() at {rules.quoted(source)} ran at steps "
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

    def _check_rows(self, rows: list) -> None:
        if not rows:
            return
        zero = self._lr_zero.add(rows)
        if zero:
            groups = sorted(zero, key=int)
            first, last = zero[groups[0]]
            self.report("lr-zero", f"the learning rate of param group(s) {', '.join(groups)} of {self._opt_name} "
                        f"was 0 at every step from {first} to {last} while the optimizer stepped",
                        step=first, groups=[int(g) for g in groups])
        plateau = self._plateau.add(rows)
        if plateau:
            a, b = plateau["best_steps"]
            self.report("loss-plateau", f"the loss has not improved by {self._plateau.rel_tol:.0%} in "
                        f"{plateau['stale_steps']} steps: median {plateau['best']:.4g} over steps {a}-{b}, "
                        f"{plateau['now']:.4g} over the latest {self._plateau.block} (step {plateau['step']})",
                        **plateau)
        bound = self._input.add(rows)
        if bound:
            cuda = any(getattr(next(m.parameters(), None), "is_cuda", False) for m in self.engine.hooks.models)
            self.data.input_bound(*bound, cuda=cuda)

    # ------------------------------------------------------------------- the crash

    def on_crash(self, exc: BaseException) -> None:
        """The script raised ``exc``."""
        try:
            text, source = str(exc), rules.crash_source(exc)
            inplace = rules.parse_inplace(text)
            if inplace is not None:
                self._report_inplace(inplace, source)
            elif rules.UNUSED_PARAMS_ERROR in text and self._nograd:
                main = self._main() if self._main is not None else None
                self._report_nograd(self._nograd, main, "before DistributedDataParallel's error", source=source)
        except Exception:
            log.exception("doctor crash analysis failed")

    def _report_inplace(self, inplace: dict, source: str | None) -> None:
        forward = rules.anomaly_source(self._anomaly_trace) if self._anomaly_trace else None
        saved = (f"{inplace['tensor']}, output {inplace['output']} of {inplace['node']}, at version "
                 f"{inplace['version']} instead of {inplace['expected']}") if inplace else "a saved tensor"
        fix = rules.RULES["inplace-autograd"].fix + ("" if forward else (
            "; to name the forward op, rerun with `ptdash --detect-anomaly ...` (or call "
            "torch.autograd.set_detect_anomaly(True) at the top of the script)"))
        self.report("inplace-autograd", f"backward() at {rules.quoted(source)} failed: a tensor it needed ({saved}) "
                    "was modified by an in-place operation"
                    + (f"; it was saved by the forward op at {rules.quoted(forward)}" if forward else ""),
                    fix=fix, source=source, forward_source=forward, **inplace)


def _call(original, when: str, callback):
    """``original`` with ``callback(obj)`` run before or after it; a failing callback is logged."""
    def wrapper(obj, *args, **kwargs):
        if when == "before":
            _quietly(callback, obj)
        result = original(obj, *args, **kwargs)
        if when == "after":
            _quietly(callback, obj)
        return result

    wrapper.__wrapped__ = original
    return wrapper


def _quietly(fn, *args) -> None:
    try:
        fn(*args)
    except Exception:  # the doctor never takes training down
        log.exception("doctor check failed")
