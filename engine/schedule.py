"""The LR schedule ahead: a copy of the script's scheduler, stepped to its end.

``simulate(sched, count)`` deep-copies the scheduler onto a stand-in optimizer that holds
copies of the param groups' hyperparameters and no parameters, and steps the copy. The
script's optimizer, its parameters and its scheduler are only read: the copy's memo maps
the optimizer to the stand-in, so nothing the copy does can reach them. What may be
copied is checked first (``why_not``): the torch schedulers with plain state, and
LambdaLR/MultiplicativeLR only with functions that provably touch nothing but their
argument, constants and ``math``.

Pure apart from reading torch objects; the preview component (preview.py) decides when
to call it, on a thread of its own.
"""

from __future__ import annotations

import argparse
import collections
import copy
import dis
import functools
import types
from typing import Any

import torch
from torch.optim import lr_scheduler as lrs

SIMULATED = (
    lrs.OneCycleLR, lrs.CosineAnnealingLR, lrs.CosineAnnealingWarmRestarts, lrs.StepLR, lrs.MultiStepLR,
    lrs.ExponentialLR, lrs.LinearLR, lrs.ConstantLR, lrs.PolynomialLR, lrs.CyclicLR, lrs.SequentialLR,
    lrs.ChainedScheduler, lrs.LambdaLR, lrs.MultiplicativeLR,
)
"""The scheduler classes whose copies are stepped (exact types: a subclass may step differently)."""

_PURE_BUILTINS = frozenset({"abs", "min", "max", "float", "int", "round", "pow", "sum", "len", "range", "bool",
                            "divmod", "ValueError", "isinstance", "tuple", "list", "enumerate", "zip"})
_PURE_MODULES = frozenset({"math"})
# Bytecode that writes somewhere other than the function's own locals, or hides code we do not read.
_WRITES = frozenset({"STORE_GLOBAL", "DELETE_GLOBAL", "STORE_DEREF", "DELETE_DEREF", "STORE_ATTR", "DELETE_ATTR",
                     "STORE_SUBSCR", "DELETE_SUBSCR", "IMPORT_NAME", "MAKE_FUNCTION", "YIELD_VALUE", "SETUP_WITH",
                     "BEFORE_WITH"})
_SCALARS = (int, float, bool, str, complex, type(None))


class _StandIn:
    """Just enough of an optimizer for a scheduler to step: param groups without parameters.

    ``_opt_called`` and the marked ``step`` are what ``LRScheduler.step`` looks for before
    warning that the optimizer never stepped; the copy must not warn into the script's output.
    """

    _opt_called = True

    def __init__(self, groups: list[dict], defaults: dict) -> None:
        self.param_groups = groups
        self.defaults = defaults
        self.state: dict = {}

    def step(self, closure=None) -> None:
        """Never called by a scheduler; present because schedulers check that it was wrapped."""

    step._wrapped_by_lr_sched = True  # type: ignore[attr-defined]


# ----------------------------------------------------------------------- what can be copied


def why_not(sched: Any) -> str | None:
    """Why ``sched`` cannot be simulated (a short phrase for the LR panel), or None when it can."""
    if isinstance(sched, lrs.ReduceLROnPlateau):
        return "ReduceLROnPlateau follows the metric it is given"
    if type(sched) not in SIMULATED:
        return f"{type(sched).__name__} is not a scheduler ptdash can simulate"
    if not plain_state(sched):
        return f"{type(sched).__name__} holds state too large to copy"
    for child in getattr(sched, "_schedulers", None) or ():
        reason = why_not(child)
        if reason is not None:
            return reason
    for fn in getattr(sched, "lr_lambdas", None) or ():
        if not pure(fn):
            return f"{type(sched).__name__}'s function may have side effects"
    custom = getattr(sched, "_scale_fn_custom", None)
    if custom is not None and not pure(custom):
        return "CyclicLR's scale function may have side effects"
    for group in getattr(sched, "optimizer", None).param_groups:
        if any(isinstance(v, torch.Tensor) and v.device.type != "cpu" for k, v in group.items() if k != "params"):
            return "a param group holds device tensors (reading them would sync)"
    return None


def pure(fn: Any, depth: int = 3) -> bool:
    """Whether calling ``fn`` can only compute: it reads its arguments, constants, ``math``,
    a few builtins and other such functions, and writes nothing outside its own locals.

    Conservative: a function this cannot prove pure is treated as impure.
    """
    if depth <= 0:
        return False
    if isinstance(fn, functools.partial):
        return pure(fn.func, depth) and all(map(_constant, (*fn.args, *fn.keywords.values())))
    if isinstance(fn, staticmethod):
        fn = fn.__func__
    if not isinstance(fn, types.FunctionType):
        return False
    code = fn.__code__
    if code.co_flags & (0x20 | 0x80 | 0x100 | 0x200):  # generator, coroutine, async generator
        return False
    for cell in fn.__closure__ or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell: assigned later, by code we do not see
            return False
        if not (_constant(value) or pure(value, depth - 1)):
            return False
    for ins in dis.get_instructions(code):
        if ins.opname in _WRITES:
            return False
        if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
            if not _pure_global(fn, ins.argval, depth):
                return False
    return True


def _pure_global(fn: types.FunctionType, name: str, depth: int) -> bool:
    if name not in fn.__globals__:
        return name in _PURE_BUILTINS
    value = fn.__globals__[name]
    if isinstance(value, types.ModuleType):
        return value.__name__ in _PURE_MODULES
    if isinstance(value, (argparse.Namespace, types.SimpleNamespace)):
        # The usual ``args.warmup``: reading a plain attribute of parsed arguments.
        return all(map(_constant, vars(value).values()))
    return _constant(value) or pure(value, depth - 1)


def _constant(value: Any) -> bool:
    if isinstance(value, _SCALARS):
        return True
    if isinstance(value, (tuple, frozenset)):
        return all(map(_constant, value))
    return False


# ------------------------------------------------------------------------------ copying


def counter(sched: Any) -> int:
    """How many times the scheduler has stepped (``last_epoch``; a ChainedScheduler's first child's)."""
    while not hasattr(sched, "last_epoch") and getattr(sched, "_schedulers", None):
        sched = sched._schedulers[0]
    return int(sched.last_epoch)


def last_lrs(sched: Any) -> list[float]:
    """The LRs the scheduler last set, one per param group, as floats (CPU tensors are read)."""
    return [float(v) for v in sched._last_lr]


def twin(sched: Any) -> Any:
    """A deep copy of ``sched`` stepping a stand-in optimizer; the original is only read.

    The stand-in's LRs are the scheduler's own last LRs rather than the live groups': while
    the optimizer steps, ptdash's LR factor is multiplied into the groups.
    """
    opt = sched.optimizer
    groups = []
    last = getattr(sched, "_last_lr", None)
    for i, group in enumerate(opt.param_groups):
        own = {k: copy.deepcopy(v) for k, v in group.items() if k != "params"}
        own["params"] = []
        if last is not None and len(last) == len(opt.param_groups):
            own["lr"] = copy.deepcopy(last[i])
        groups.append(own)
    stand_in = _StandIn(groups, {k: copy.deepcopy(v) for k, v in opt.defaults.items() if k != "params"})
    memo: dict = {id(opt): stand_in}
    # Shells made with object.__new__, not deepcopy's ``cls.__new__``: ptdash's discovery
    # registers every scheduler created through that, and a copy is no scheduler of the
    # script's (a checkpoint would save it).
    originals = []
    stack = [sched]
    while stack:
        one = stack.pop()
        memo[id(one)] = object.__new__(type(one))
        originals.append(one)
        stack.extend(getattr(one, "_schedulers", None) or ())
    for one in originals:
        vars(memo[id(one)]).update(copy.deepcopy(vars(one), memo))
    return memo[id(sched)]


def simulate(sched: Any, count: int) -> tuple[list[list[float]], bool]:
    """The LRs ``sched`` sets now and after each of its next ``count`` steps, and whether it
    reached its end first (a OneCycleLR refuses to step past its total).

    ``[0]`` is the scheduler's current ``get_last_lr()``; ``[k]`` what it will be after ``k``
    more ``step()`` calls, computed exactly as the scheduler computes it.
    """
    return advance(twin(sched), count)


def advance(copy_: Any, count: int) -> tuple[list[list[float]], bool]:
    """Step a copy made by ``twin`` ``count`` times: its LRs now and after each step, and
    whether it ended first. Called again on the same copy, it goes on where it stopped."""
    out = [last_lrs(copy_)]
    for _ in range(count):
        try:
            copy_.step()
        except (ValueError, ZeroDivisionError, OverflowError):
            return out, True
        out.append(last_lrs(copy_))
    return out, False


def natural_end(sched: Any) -> int | None:
    """The scheduler step at which the schedule is over, when it says (for a run's length).

    OneCycleLR's total, CosineAnnealingLR's ``T_max``, PolynomialLR's ``total_iters``; a
    SequentialLR ends where its last scheduler does; a ChainedScheduler with its latest
    child. Warm-ups (LinearLR, ConstantLR) and periodic schedules have no end of their own.
    """
    if isinstance(sched, lrs.OneCycleLR):
        return sched.total_steps
    if isinstance(sched, lrs.CosineAnnealingLR):
        return sched.T_max
    if isinstance(sched, lrs.PolynomialLR):
        return sched.total_iters
    if isinstance(sched, lrs.SequentialLR):
        last = natural_end(sched._schedulers[-1])
        return None if last is None else sched._milestones[-1] + last
    if isinstance(sched, lrs.ChainedScheduler):
        ends = [e for e in map(natural_end, sched._schedulers) if e is not None]
        return max(ends) if ends else None
    return None


def plain_state(sched: Any) -> bool:
    """Whether the scheduler's own state is small and plain enough to deep-copy (no models,
    no tensors beyond a few LRs), so a copy never duplicates something large."""
    for key, value in vars(sched).items():
        if key == "optimizer":
            continue
        if key == "_schedulers":
            if not all(map(plain_state, value)):
                return False
        elif not _plain(value):
            return False
    return True


def _plain(value: Any, depth: int = 3) -> bool:
    if _constant(value) or isinstance(value, (types.FunctionType, functools.partial, staticmethod)):
        return True
    if isinstance(value, torch.Tensor):
        return value.numel() <= 1 and value.device.type == "cpu"
    if depth and isinstance(value, (list, tuple, dict, collections.Counter)):
        items = value.values() if isinstance(value, dict) else value
        return len(items) <= 10_000 and all(_plain(v, depth - 1) for v in items)
    return False
