"""The names of the series: one grammar, built and parsed here and nowhere else.

A series name carries its scope and unit: ``loss``, ``grad/norm_total``, ``time/step_s``,
``gpu0/mem_allocated_bytes``, ``host/cpu_pct``, ``user/acc``, ``printed/val_loss``. The main optimizer's series
have no prefix, except its LRs, ``opt/lr/group<g>``; the k-th other optimizer's carry
``opt<k>/`` (``opt1/loss``, ``opt1/grad/norm_total``, ``opt1/lr/group0``). Exports add two
more: another rank's column is ``rank<r>/<name>``, a parameter's ``layer/<param>/<field>``.

The engine builds names with these functions and constants; the dashboard, export, compare,
``show --once`` and the doctor read them back with the parsers, so a name is spelled in one
place. A test walks both halves for series names spelled outside this module. Stdlib only.
"""

from __future__ import annotations

import re
from typing import Iterable, NamedTuple

LOSS = "loss"
MICRO_BATCHES = "loss/micro_batches"
"""Backward calls the step's loss is the sum of (gradient accumulation)."""
GRAD_NORM = "grad/norm_total"
"""The total gradient norm before clipping."""
GRAD_NORM_LOCAL = "grad/norm_local"
"""Of sharded parameters (FSDP) on a step the script's clip does not reduce: this rank's
shards' gradient norm, a part of the total (whose square is the sum of the ranks' squares)."""
CLIP_MAX = "grad/clip_max"
"""The clipping norm in force (the script's, or the live override)."""
CLIPPED = "grad/clipped"
"""1 where the step's gradients were clipped, 0 where not."""

STEP_S = "time/step_s"
DATA_S = "time/data_s"
COMPUTE_S = "time/compute_s"
OPTIM_S = "time/optim_s"
OTHER_S = "time/other_s"
SAMPLES_PER_S = "throughput/samples_per_s"
TIMES = (STEP_S, DATA_S, COMPUTE_S, OPTIM_S, OTHER_S)
"""A step's time and its parts (the parts on sampled steps only)."""

_HOST = "host/"
_USER = "user/"
_PRINTED = "printed/"
_PTDASH = "ptdash/"


def host(metric: str) -> str:
    """A host reading: ``host/cpu_pct``, ``host/rss_bytes``..."""
    return _HOST + metric


HOST_CPU_PCT = host("cpu_pct")
HOST_PROC_CPU_PCT = host("proc_cpu_pct")
HOST_WORKERS_CPU_PCT = host("workers_cpu_pct")
HOST_WORKERS = host("workers")
HOST_MEM_USED = host("mem_used_bytes")
HOST_MEM_TOTAL = host("mem_total_bytes")
HOST_RSS = host("rss_bytes")
HOST_WORKERS_RSS = host("workers_rss_bytes")


def ptdash(metric: str) -> str:
    """One of ptdash's readings of its own cost: ``ptdash/step_pct``..."""
    return _PTDASH + metric


STEP_PCT = ptdash("step_pct")
THREADS_PCT = ptdash("threads_pct")
LAYERS_EVERY = ptdash("layers_every")
DOCTOR_EVERY = ptdash("doctor_every")
KEPT_STEPS = ptdash("kept_steps")
"""Main steps this engine process recorded (the counts below are out of these)."""
KEPT_NORM = ptdash("kept_norm_steps")
"""Of them, the steps with a total gradient norm."""
KEPT_LAYERS = ptdash("kept_layer_steps")
"""The steps whose per-layer norms the store kept (its per-layer history)."""
KEPT_RATIOS = ptdash("kept_ratio_steps")
"""The steps whose update ratios the store kept."""
BUDGET_PCT = ptdash("budget_pct")


# ------------------------------------------------------------------------ optimizers


def of_optimizer(index: int, name: str) -> str:
    """The series ``name`` (``loss``, ``grad/norm_total``...) of optimizer ``index``: the
    main one's (0) is ``name`` itself, the k-th other's ``opt<k>/<name>``."""
    return f"opt{index}/{name}" if index else name


_OPTIMIZER = re.compile(r"opt(\d+)/(.+)")
_LR = re.compile(r"opt(\d*)/lr/group(\d+)")


def optimizer_of(name: str) -> tuple[int, str]:
    """``(optimizer index, the name within it)``: ``opt1/loss`` -> ``(1, "loss")``,
    ``loss`` -> ``(0, "loss")``; an LR is ``(k, "lr/group<g>")``."""
    match = _OPTIMIZER.fullmatch(name)
    if match is not None:
        return int(match.group(1)), match.group(2)
    if name.startswith("opt/lr/"):
        return 0, name[4:]
    return 0, name


def others(names: Iterable[str], name: str) -> list[tuple[int, str]]:
    """``(k, series)`` of the other optimizers' ``opt<k>/<name>`` among ``names``, by k."""
    found = []
    for series in names:
        index, base = optimizer_of(series)
        if index and base == name:
            found.append((index, series))
    return sorted(found)


def lr(index: int, group: int) -> str:
    """The LR of param group ``group`` of optimizer ``index``: ``opt/lr/group0``, ``opt1/lr/group2``."""
    return f"opt{index or ''}/lr/group{group}"


MAIN_LR_PREFIX = "opt/lr/group"
"""What the main optimizer's LR names start with (followed by the group number)."""


class LR(NamedTuple):
    """An LR series' place: which optimizer, which param group."""

    optimizer: int
    group: int


def parse_lr(name: str) -> LR | None:
    """The ``(optimizer, group)`` of an LR series, or None for any other name."""
    match = _LR.fullmatch(name)
    if match is None or match.group(1) == "0":  # the main optimizer's are opt/lr/..., never opt0/
        return None
    return LR(int(match.group(1) or 0), int(match.group(2)))


def lr_names(names: Iterable[str]) -> list[str]:
    """The LR series among ``names``: the main optimizer's first, then by optimizer and group."""
    found = [(where, name) for name in names if (where := parse_lr(name)) is not None]
    return [name for _, name in sorted(found)]


# ---------------------------------------------------------------------- devices, users


_GPU = re.compile(r"gpu(\d+)/(.+)")


def gpu(index: int, metric: str) -> str:
    """A reading of GPU ``index``: ``gpu0/mem_allocated_bytes``, ``gpu1/nvml_util_pct``..."""
    return f"gpu{index}/{metric}"


def parse_gpu(name: str) -> tuple[int, str] | None:
    """``(GPU index, metric)`` of a GPU reading, or None."""
    match = _GPU.fullmatch(name)
    return (int(match.group(1)), match.group(2)) if match is not None else None


def user(name: str) -> str:
    """A value the script gave ``ptdash.log``: ``user/acc``."""
    return _USER + name


def parse_user(name: str) -> str | None:
    """The name the script logged, or None for a series it did not log."""
    return name[len(_USER):] if name.startswith(_USER) else None


USER_LR = user("lr")
"""The LR a script with no torch.optim optimizer reports with ``ptdash.log(lr=...)``."""


# ------------------------------------------------------------------- printed metrics
#
# A metric the script only prints (``val loss 2.29``, ``{'eval_loss': 0.29}``) is kept as
# ``printed/<name>``, its name as printed, lower case, words joined by ``_``
# (engine/printparse.py). It never shares a series with ptdash's own (``loss`` is the loss
# ptdash reads at backward; ``printed/loss`` what the script printed), and a name the script
# also gives ``ptdash.log`` (``user/val_loss``) is left out: the explicit value wins.

SPLITS = ("train", "training", "val", "valid", "validation", "eval", "evaluation", "test", "testing", "dev",
          "predict")
"""The words that say which data a printed metric was measured on, where a name starts with one."""
HELD_OUT = frozenset(SPLITS) - {"train", "training"}
"""The splits that are not the training data: a metric measured on them is a validation metric."""
_QUALIFIERS = frozenset({"avg", "average", "mean"})
"""Words that do not change what a metric is (``test_average_loss`` is a test loss)."""
_PARTS = re.compile(r"[_ ./-]+")


def printed(name: str) -> str:
    """A metric the script printed: ``printed/val_loss``."""
    return _PRINTED + name


def parse_printed(name: str) -> str | None:
    """The printed metric's own name, or None for a series that was not printed."""
    return name[len(_PRINTED):] if name.startswith(_PRINTED) else None


class Split(NamedTuple):
    """A printed metric's data (``val``, or None where its name says none) and what it
    measures (``loss``, ``acc``, ``loss_epoch``)."""

    split: str | None
    base: str


def split_of(name: str) -> Split:
    """``val_loss`` -> ``("val", "loss")``, ``test_average_loss`` -> ``("test", "loss")``,
    ``train/loss_step`` -> ``("train", "loss_step")``, ``acc`` -> ``(None, "acc")``."""
    words = [w for w in _PARTS.split(name) if w]
    split = words.pop(0) if len(words) > 1 and words[0] in SPLITS else None
    kept = [w for w in words if w not in _QUALIFIERS] or words
    return Split(split, "_".join(kept))


def held_out(name: str) -> bool:
    """Whether a printed metric was measured on data other than the training data."""
    return split_of(name).split in HELD_OUT


# ---------------------------------------------------------------------------- exports


def ranked(rank: int, name: str) -> str:
    """An export's column of ``name`` on ``rank``: rank 0's is ``name``, another's ``rank<r>/<name>``."""
    return f"rank{rank}/{name}" if rank else name


def layer(param: str, field: str) -> str:
    """An export's column of one parameter's statistic: ``layer/fc.weight/grad_norm``."""
    return f"layer/{param}/{field}"
