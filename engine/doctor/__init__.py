"""The training doctor: live detection of the classic silent PyTorch bugs.

Each rule raises a finding once, with what was seen, why it matters and the fix (the
catalogue is ``rules.RULES``). The hooks call the ``on_*`` methods; they stay cheap: no
host sync on a GPU, anything that needs device values is confirmed at the flush, on the
host. One module per family of checks:

- ``gradients``: grads-never-cleared, zero-grad-before-step;
- ``modes``: train-in-eval-mode, never-learns;
- ``data``: sampler-no-set-epoch, dataparallel, input-bound;
- ``trends``: lr-zero, loss-plateau (flush-time, over host rows);
- ``syncs``: host-syncs (CUDA only, sampled);
- ``crash``: inplace-autograd and DDP's unused-parameter error, read from the crash;
- ``pywarnings``: the script's Python warnings become ``warning`` events, each once.

The training-thread checks run on the steps ``watches()`` picks (every step at first,
then one in WATCH_EVERY), so a healthy loop pays for them on a few steps only.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any, Callable

import torch
from torch import nn

from ..discovery import find_models, param_names
from ..patching import Patches
from ..shared import events
from ..shared.config import RunConfig
from . import crash
from .data import DataWatch, InputBound
from .gradients import Gradients
from .modes import Modes
from .pywarnings import PythonWarnings
from .rules import RULES
from .sources import anomaly_source, crash_source, quoted, remove_filter
from .syncs import SyncSampler
from .trends import Trends

log = logging.getLogger("ptdash.doctor")

WATCH_FIRST = 64
WATCH_EVERY = 16
"""The training-thread checks watch every step up to WATCH_FIRST (past the 50 steps
never-learns waits), then every WATCH_EVERY-th: the bugs they look for repeat every step,
and a step not watched costs them nothing."""


def watches(step: int, every: int = WATCH_EVERY) -> bool:
    """Whether the training-thread checks watch step ``step`` (counted from 1), past the
    first WATCH_FIRST steps one in ``every``."""
    return step <= WATCH_FIRST or step % every == 0


class Doctor:
    """Receives the hooks' calls and reports findings as ``finding`` events.

    ``event(data, message)`` journals an event (events.py); ``models()`` and ``step()`` give
    the current models and step; ``loader()`` describes the training DataLoader;
    ``judge_loss`` is False on ranks other than 0, where the loss-based rules stay quiet.
    """

    def __init__(self, event: Callable[..., None], config: RunConfig, models: Callable[[], list],
                 step: Callable[[], int], loader: Callable[[], tuple | None] = lambda: None,
                 judge_loss: bool = True) -> None:
        self._event, self._config, self._models = event, config, models
        self._lock = threading.Lock()
        self._reported: set[str] = set()
        self._patches = Patches()
        self._cuda = False
        self._anomaly: tuple[bool, Any] | None = None
        self._main: weakref.ref | None = None
        self._opt_name = "the optimizer"
        self.gradients = Gradients(self.report, self.names)
        self.modes = Modes(self.report, self.names, models)
        self.data = DataWatch(self.report, step, loader)
        self.input_bound = InputBound()
        self.trends = Trends(self.report)
        self._judge_loss = judge_loss
        """Whether the loss-based rules run here (rank 0 only: one finding per run, not per rank)."""
        self.syncs = SyncSampler()
        self.warnings = PythonWarnings(event, lambda message, frame: self.syncs.on_warning(message, frame))
        self.watching = True
        """Whether the hooks call ``on_backward``, ``on_zero_grad`` and ``on_pre_step`` this step."""
        self.post_from = 0
        """The hooks call ``on_post_step`` after each step from this one on (it moves ahead
        while no step is watched)."""
        self.spacing = 1
        """The cost budget's sampling period (budget.py): past the first steps the checks
        watch one step in ``WATCH_EVERY * spacing``."""

    # ------------------------------------------------------------ attach / detach

    def attach(self) -> None:
        """Install the doctor's own patches (called once, before the script runs)."""
        import warnings

        self._cuda = torch.cuda.is_available()
        self._patches.set(warnings, "showwarning", self.warnings.wrap(warnings.showwarning))
        self._patches.set(nn.Module, "zero_grad", self._wrap_module_zero_grad(nn.Module.zero_grad))
        self._patches.set(nn.Module, "train", self.modes.wrap_train(nn.Module.train))
        for owner, name, when, callback in self.data.patches():
            self._patches.set(owner, name, _call(getattr(owner, name), when, callback))
        if self._config.detect_anomaly:
            # Slow (a stack trace per forward op), so only on request: it names the forward
            # op whose saved tensor an in-place operation overwrote.
            before = torch.is_anomaly_enabled()
            torch.autograd.set_detect_anomaly(True)
            warnings.filterwarnings("always", message="Error detected in")
            self._anomaly = (before, warnings.filters[0])
            self._event("run", "anomaly detection on (--detect-anomaly): backward is slower")

    def detach(self) -> None:
        """Undo ``attach``."""
        self.syncs.stop()
        self.gradients.stop()
        if self._anomaly is not None:
            torch.autograd.set_detect_anomaly(self._anomaly[0])
            remove_filter(self._anomaly[1])
            self._anomaly = None
        self._patches.undo()

    # ----------------------------------------------------------------- reporting

    def report(self, rule: str, what: str, why: str | None = None, fix: str | None = None,
               key: str | None = None, **data) -> None:
        """Raise finding ``rule`` once per ``key`` (default: the rule id); texts from RULES."""
        key = key or rule
        with self._lock:
            if key in self._reported:
                return
            self._reported.add(key)
        entry = RULES.get(key, RULES[rule])
        self._event(events.Finding.from_data({**data, "id": rule, "what": what, "why": why or entry.why,
                                              "fix": fix or entry.fix, "severity": entry.severity}),
                    f"{rule}: {what}")

    def names(self, params: list) -> list[str]:
        models = list(self._models())
        main = self._main() if self._main is not None else None
        if not models and main is not None:
            models = find_models([main])
        return param_names(models, params)

    # --------------------------------------------------------- training-thread hooks

    def on_backward(self) -> None:
        """A backward pass ran (training thread)."""
        _quietly(self.gradients.on_backward)

    def on_zero_grad(self, owner) -> None:
        """``zero_grad`` was called on an optimizer or module (training thread)."""
        main = self._main() if self._main is not None else None
        _quietly(self.gradients.on_zero_grad, owner, main)

    def _wrap_module_zero_grad(self, original):
        doctor = self

        def zero_grad(module, *args, **kwargs):
            if not doctor.watching:  # as the optimizer's zero_grad (wrappers.py): watched steps only
                return original(module, *args, **kwargs)
            before = doctor.gradients.sample_state()
            result = original(module, *args, **kwargs)
            if doctor.gradients.sample is None or doctor.gradients.sample_state() != before:
                doctor.on_zero_grad(module)
            return result

        zero_grad.__wrapped__ = original
        return zero_grad

    def on_pre_step(self, opt, step: int, params_with_grad: list) -> None:
        """Before the update of step ``step`` of the main optimizer, gradients final."""
        try:
            if self._main is None or self._main() is not opt:
                self._main = weakref.ref(opt)
                self._opt_name = type(opt).__name__
                self.gradients.reset(opt)
                self.modes.reset(opt, step)
            self.gradients.on_pre_step(step, params_with_grad)
            self.modes.on_pre_step(opt, step, params_with_grad)
        except Exception:
            log.exception("doctor check failed")

    def on_post_step(self, opt, step: int) -> None:
        """After the update of step ``step``: decides whether the next step is watched.

        The hooks call it from step ``post_from`` on: every step while watching (or on
        CUDA, for the sync sampler), else only before the next watched step. ``opt`` is the
        main optimizer, or None for an inferred step of a script without one (manual.py).
        """
        try:
            if (self._main() if self._main is not None else None) is not opt:
                return
            every = WATCH_EVERY * self.spacing
            watch = watches(step + 1, every)
            self.gradients.on_post_step(watch)
            self.watching = watch
            if watch or self._cuda:
                self.post_from = step + 1
            else:  # nothing to do until the step before the next watched one
                self.post_from = ((step + 1) // every + 1) * every - 1
            if self._cuda and (self.syncs.active or torch.cuda.is_initialized()):
                found = self.syncs.on_post_step(step)
                if found:
                    lines = "; ".join(f"{quoted(x['source'])} x{x['per_step']}" for x in found["lines"][:5])
                    self.report("host-syncs", f"{found['per_step']} device-to-host sync(s) per step (sampled steps "
                                f"{found['steps'][0]} and {found['steps'][1]}): {lines}",
                                step=found["steps"][1], source=found["lines"][0]["source"], lines=found["lines"][:10])
        except Exception:
            log.exception("doctor check failed")
            self._cuda = False
            self.syncs.stop()

    # ---------------------------------------------------------------- flusher thread

    def on_flush(self, rows: list, layer_rows: list, to_host: Callable[[list], list]) -> None:
        """Host values of the steps since the previous flush (flusher thread)."""
        self.gradients.on_flush(layer_rows, to_host)
        if not rows:
            return
        try:
            if self._judge_loss:
                self.trends.on_rows(rows, self._opt_name)
            bound = self.input_bound.add(rows)
            if bound:
                cuda = any(getattr(next(m.parameters(), None), "is_cuda", False) for m in self._models())
                self.data.input_bound(*bound, cuda=cuda, hint=lambda message, share: self._event(
                    events.Hint(data_share=share), message))
        except Exception:
            log.exception("doctor flush check failed")

    # ------------------------------------------------------------------- the crash

    def on_crash(self, exc: BaseException) -> None:
        """The script raised ``exc``."""
        try:
            text, source = str(exc), crash_source(exc)
            inplace = crash.parse_inplace(text)
            if inplace is not None:
                trace = self.warnings.anomaly_trace
                what, fix = crash.inplace_finding(inplace, source, anomaly_source(trace) if trace else None,
                                                  RULES["inplace-autograd"].fix)
                forward = anomaly_source(trace) if trace else None
                self.report("inplace-autograd", what, fix=fix, source=source, forward_source=forward, **inplace)
            elif crash.UNUSED_PARAMS_ERROR in text:
                main = self._main() if self._main is not None else None
                self.modes.on_ddp_unused_error(main, source)
        except Exception:
            log.exception("doctor crash analysis failed")


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
