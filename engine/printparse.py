"""What one line of a script's output says about its metrics: ``(name, value)`` pairs, or none.

Pure functions of the text; the stream around them (carriage returns, the step, the
series) is printread.py's and printed.py's. The forms scripts and frameworks print:

- ``name=value``, ``name: value``, ``name value``, where the name holds a metric word
  (``loss``, ``acc``, ``ppl``, ``f1``, ``top1``, ``reward``... ``METRIC``), with the words
  just before it (``valid loss 5.53``, ``Average reward: 10.7``): PyTorch's examples,
  nanoGPT, Keras (``- loss: 0.0258 - val_rmse: 0.040``), table rows
  (``| valid loss 5.53 | valid ppl 252.9 |``), a tqdm or Lightning bar's postfix
  (``9.1it/s, val_mse=0.22, top1=0.6]``); ``Accuracy: 9890/10000 (99%)`` is 99;
- a whole line that is a Python dict or a JSON object (the Hugging Face Trainer's
  ``{'eval_loss': 0.29, 'eval_accuracy': 0.97, 'epoch': 0.15}``): its numbers whose key
  holds a metric word or starts with a split (``eval_matthews_correlation``).

A line that starts with a split (``Test set: Average loss: 0.03``) names its metrics
after it (``test_average_loss``) unless they name their own.

Not metrics: the counters (step, epoch, iter, batch: no metric word), timings and rates
(``12ms``, ``9.1it/s``, ``time 0.3``, ``eval_runtime``, ``*_per_second``), learning rates
(``lr``, ``learning_rate``: the optimizer's are recorded already, ``opt/lr/group0``), a
bar's percentage, dates and times, versions (``2.1.0``), numbers inside words and paths
(``resnet50``, ``val_loss=0.30.ckpt``), hyperparameters (``loss_weight=0.5``), the
keyword arguments of a printed object (``Namespace(lr=0.1, ...)``,
``TrainingArguments(...)``), and the source lines of a traceback or a warning.
"""

from __future__ import annotations

import ast
import json
import math
import re

from .shared import names

MAX_LINE = 4096
"""Longer lines are not read for metrics (a dump, not a report)."""

METRIC = re.compile(
    r"[a-z]*loss(?:es)?[a-z0-9]*|acc(?:uracy)?\d*|top-?\d+|ppl|perplexity|bleu\d*|sacrebleu|rouge[a-z0-9]*|chrf"
    r"|meteor|f1|fscore|auc|auroc|mse|rmse|mae|mape|smape|nll|elbo|kl|psnr|ssim|lpips|fid|iou|miou|dice|wer|cer"
    r"|bpc|bpd|precision|recall|reward|rewards|return|returns|score|error|err|r2|pearson|spearman|spearmanr|mcc"
    r"|matthews|exact|mrr|map|ndcg\d*|likelihood|entropy")
"""A word of a name that makes it a metric (matched against whole words, lower case)."""

NEVER = frozenset({
    "time", "times", "runtime", "sec", "secs", "second", "seconds", "ms", "per", "throughput", "speed", "eta",
    "elapsed", "lr", "learning", "mfu", "flos", "flops", "mem", "memory", "weight", "weights", "scale", "scaler",
    "coef", "coeff", "factor", "smoothing", "clip", "threshold", "patience", "delta", "fn", "func", "type"})
"""Words that make a name a timing, a rate, a learning rate or a setting, whatever else it holds."""

COUNTS = frozenset({
    "epoch", "epochs", "step", "steps", "iter", "iters", "iteration", "iterations", "batch", "batches", "samples",
    "sample", "tokens", "size", "num", "count", "seed", "id", "idx", "index", "warmup", "delay", "accumulation",
    "rank", "world", "workers", "global"})
"""Words of a counter or a size: a dict key with a split and one of these is no metric."""

STOP = frozenset({
    "the", "a", "an", "of", "is", "was", "are", "and", "or", "to", "at", "in", "on", "for", "with", "by", "from",
    "as", "set", "step", "steps", "epoch", "epochs", "iter", "iteration", "done", "end", "info", "debug",
    "warning", "new"})
"""Words before a metric's name that are not part of it (``with loss 0.3`` is ``loss``)."""

_VALUE = r"[-+]?(?:\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|nan|inf(?:inity)?)"
PAIR = re.compile(
    r"(?<![\w@./\\'\"-])['\"]?(?P<name>[A-Za-z](?:[\w@./-]*[A-Za-z0-9])?)['\"]?"
    r"(?P<sep>\s*[=:]\s*|\s+)"
    r"(?P<frac>\d+/\d+\s*\(\s*)?"  # "Accuracy: 9890/10000 (99%)": the percentage
    rf"(?P<value>{_VALUE})(?P<pct>\s?%)?(?(frac)\s*\))"
    # Not a value when it goes on as a word, a unit, a rate, a time, a date, a version, a path.
    r"(?![\w@/\\*]|\.\w|[,:-]\d)", re.IGNORECASE)
_WORDS_BEFORE = re.compile(r"(?<![\w/.@-])(?:([A-Za-z]+) )?([A-Za-z]+) $")
_FIRST_WORD = re.compile(r"[^A-Za-z]{0,4}([A-Za-z]+)(?=[\s:])")
_WORD = re.compile(r"[_\-./@ ]+")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_CALL = re.compile(r"\s*[A-Za-z_][\w.]*\(\s*\w+=")
"""A printed object with keyword arguments: ``Namespace(lr=0.1, ...)``, ``TrainingArguments(``."""
_CONTINUED = re.compile(r"\s*\w+=[^=]*,\s*$")
"""One keyword argument a line, as a long object's repr goes on (``eval_delay=0,``)."""
_SOURCE_BEFORE = re.compile(r'\s*File "|.*:\d+: \w*Warning: ')
"""A line that a line of source code follows (a traceback's frame, a warning)."""


def is_metric(name: str, structured: bool = False) -> bool:
    """Whether ``name`` (lower case) names a metric: a metric word and none of NEVER; or,
    ``structured`` (a dict's key), a split first and no counter."""
    words = [w for w in _WORD.split(name) if w]
    if any(w in NEVER for w in words):
        return False
    if any(METRIC.fullmatch(w) for w in words):
        return True
    return structured and len(words) > 1 and words[0] in names.SPLITS and not any(w in COUNTS for w in words)


def number(text: str) -> float | None:
    """A printed value as a float; a non-finite one (``nan``, ``inf``) as None."""
    value = float(text)
    return value if math.isfinite(value) else None


def clean(line: str) -> str:
    """A line without terminal escapes (colours, cursor moves) and backspaces."""
    if "\x1b" in line:
        line = _ANSI.sub("", line)
    return line.replace("\b", "") if "\b" in line else line


def skipped(line: str, previous: str = "") -> bool:
    """Whether ``line`` is not read for metrics: too long, an object's keyword arguments, or
    source code (after ``previous``, a traceback's ``File "..."`` line or a warning)."""
    return (len(line) > MAX_LINE or bool(_CALL.match(line)) or bool(_CONTINUED.match(line))
            or bool(previous and _SOURCE_BEFORE.match(previous)))


def parse(line: str) -> list[tuple[str, float | None]]:
    """The metrics ``line`` prints, in order: ``[("val_loss", 2.29), ...]``."""
    stripped = line.strip()
    if stripped[:1] == "{" and stripped[-1:] == "}":
        found = _structured(stripped)
        if found is not None:
            return found
    return _pairs(line)


def _structured(text: str) -> list[tuple[str, float | None]] | None:
    """A dict or JSON object's metrics; None when the line is neither."""
    try:
        data = json.loads(text)
    except ValueError:
        try:
            data = ast.literal_eval(text)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return None
    if not isinstance(data, dict):
        return None
    found = []
    for key, value in data.items():
        if not isinstance(key, str) or isinstance(value, bool):
            continue
        name = key.strip().lower().replace(" ", "_")
        if not name or not is_metric(name, structured=True):
            continue
        if isinstance(value, (int, float)):
            try:
                found.append((name, _finite(float(value))))
            except OverflowError:  # an int too large for a float
                found.append((name, None))
        elif isinstance(value, str):  # fairseq's JSON logs print their numbers as strings
            try:
                found.append((name, number(value)))
            except ValueError:
                pass
    return found


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _pairs(line: str) -> list[tuple[str, float | None]]:
    found = []
    context = None
    first = _FIRST_WORD.match(line)
    for match in PAIR.finditer(line):
        name = match.group("name").lower()
        if not is_metric(name):
            continue
        start = match.start("name")
        words = _WORDS_BEFORE.search(line, max(0, start - 40), start) if start and line[start - 1] == " " else None
        if words is not None:
            kept = []
            for word in reversed([w.lower() for w in words.groups() if w]):
                if word in STOP:
                    break
                kept.insert(0, word)
            if kept:
                start = words.start(2) if len(kept) == 1 else words.start(1)
            name = "_".join(kept + [name])
        if context is None:
            # The line's first word names the data ("Test set: ...") unless it starts the first metric's name.
            context = first.group(1).lower() if first and first.start(1) != start else ""
            context = context if context in names.SPLITS else ""
        if context and _WORD.split(name)[0] not in names.SPLITS:
            name = f"{context}_{name}"
        found.append((name, number(match.group("value"))))
    return found
