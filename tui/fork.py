"""``ptdash fork RUN [--at STEP | --from CKPT] [options]``: a new run from one of RUN's checkpoints.

The new run is RUN's script with RUN's arguments, in RUN's working directory, resumed
from the checkpoint (``--resume``: the script's objects loaded at its first forward, the
step count continued), with RUN's options and any given here in their place. Its run.json
names the parent and the step it forked at (``ls``, ``show --once`` say so), and the
dashboard draws the parent behind it (``compare.py``). W&B forks a run's metric history;
this forks the training itself.

``prepare`` turns the fork's words into the command line of a plain run (``ptdash
[options] script [args]``), which ``cli`` then starts as any other, in the parent's working
directory. Nothing is created before every check has passed.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ptdash.shared.config import RunInfo

from . import checks, runs, subcommands
from .errors import CliError

_CHECKPOINT = re.compile(r"^step-(\d+)\.pt$")
LISTED = 8
"""Checkpoint steps a refusal lists."""
NOT_OPTIONS = ("-m", "--resume")
"""Run options a fork has from its parent: the script, and the checkpoint it starts from."""


def prepare(argv: list[str], run_parser) -> tuple[list[str], dict]:
    """The run's command line (for ``run_parser``, cli's) and its lineage for run.json; makes
    the parent's working directory the current one. Raises CliError with one line."""
    takes_value = {opt for action in run_parser._actions if action.nargs != 0 and action.option_strings
                   for opt in action.option_strings}
    own, options = _split(argv, takes_value)
    args = subcommands.parse("fork", own)
    for word in options:
        if word.split("=", 1)[0] in NOT_OPTIONS:
            raise CliError(f"{word.split('=', 1)[0]} is not an option of ptdash fork: the fork runs its parent's "
                           "script from the checkpoint --at or --from names (see ptdash fork --help)")
    run_parser.parse_args(options)  # a bad option is one line now, before anything is made
    parent = runs.resolve(args.run, everywhere=True)
    info = parent.info
    checkpoint, step = _checkpoint(parent, args.at, args.source)
    if not info.argv:
        raise CliError(f"{parent.path} does not say what it ran (no argv in its run.json)", 2)
    if not Path(info.cwd).is_dir():
        raise CliError(f"{parent.path} ran in {info.cwd or 'an unknown directory'}, which is not there any more", 2)
    options = _absolute(options, "--run-dir")
    if not any(w.split("=", 1)[0] == "--name" for w in options):
        options += ["--name", f"{info.name}-fork{step}"]
    print(f"[ptdash] fork of {parent.path} at step {step} ({checkpoint.name}), in {info.cwd}", flush=True)
    os.chdir(info.cwd)
    lineage = {"parent": str(parent.path), "parent_id": info.id, "fork_step": step}
    return [*inherited(info), *options, "--resume", str(checkpoint), *info.argv], lineage


def _split(argv: list[str], takes_value: set[str]) -> tuple[list[str], list[str]]:
    """The fork's own words (RUN, --at, --from, --help) and the run options among ``argv``."""
    own, options = [], []
    i = 0
    while i < len(argv):
        word = argv[i]
        key = word.split("=", 1)[0]
        into = own if key in ("--at", "--from", "-h", "--help") or not word.startswith("-") else options
        into.append(word)
        if word.startswith("-") and "=" not in word and (key in ("--at", "--from") or key in takes_value) \
                and i + 1 < len(argv):
            into.append(argv[i + 1])
            i += 1
        i += 1
    return own, options


def _absolute(options: list[str], option: str) -> list[str]:
    """``option``'s path made absolute: the run starts in the parent's working directory."""
    out = list(options)
    for i, word in enumerate(out):
        if word == option and i + 1 < len(out):
            out[i + 1] = str(Path(out[i + 1]).absolute())
        elif word.startswith(option + "="):
            out[i] = f"{option}={Path(word.split('=', 1)[1]).absolute()}"
    return out


def _checkpoint(parent: runs.RunSummary, at: int | None, source: str | None) -> tuple[Path, int]:
    """The checkpoint to fork from and the step it holds."""
    folder = parent.path / "checkpoints"
    saved = sorted(int(m.group(1)) for p in folder.glob("step-*.pt") if (m := _CHECKPOINT.match(p.name))) \
        if folder.is_dir() else []
    if source is not None:
        path = Path(source)
        if not path.exists() and (folder / source).exists():
            path = folder / source
    elif at is not None:
        path = folder / f"step-{at}.pt"
        if not path.is_file():
            raise CliError(f"{parent.path} has no checkpoint at step {at}; {_listing(saved)}", 2)
    elif saved:
        path = folder / f"step-{saved[-1]}.pt"
    else:
        raise CliError(f"{parent.path} has no checkpoint to fork from (a run saves them with --checkpoint-every, "
                       "the c key or ptdash ctl RUN checkpoint, and when it is stopped)", 2)
    path = path.absolute()
    step = checks.checkpoint(path)
    if step is None:
        raise CliError(f"{path} does not say the step it was saved at", 2)
    return path, step


def _listing(steps: list[int]) -> str:
    if not steps:
        return "it has none"
    shown = ", ".join(map(str, steps[:LISTED])) + (f" ... {steps[-1]} ({len(steps)} in all)"
                                                   if len(steps) > LISTED else "")
    return f"it has steps {shown}"


def inherited(info: RunInfo) -> list[str]:
    """The parent's options as a command line's, but for the clip and LR factor (the
    checkpoint's live values are restored) and those only its start needed (--profile-steps,
    --pause-timeout, --share-group)."""
    c = info.config
    out = ["--on-anomaly", c.on_anomaly, "--update-ratio-every", str(c.update_ratio_every),
           "--overhead-budget", str(c.overhead_budget), "--stall-timeout", str(c.stall_seconds)]
    if c.checkpoint_every:
        out += ["--checkpoint-every", str(c.checkpoint_every)]
    elif c.checkpoint_every_s:
        out += ["--checkpoint-every", f"{c.checkpoint_every_s}s"]
    for option, value in (("--keep-last", c.keep_last), ("--steps", c.steps), ("--flush-interval", c.flush_interval)):
        if value is not None:
            out += [option, str(value)]
    out += [flag for flag, on in (("--detect-anomaly", c.detect_anomaly), ("--memory-history", c.memory_history),
                                  ("--no-parse-output", not c.parse_output)) if on]
    if (info.nproc_per_node or 1) > 1:
        out += ["--nproc-per-node", str(info.nproc_per_node)]
    return out
