"""The ``ptdash`` command: shaped like ``python`` and ``torchrun``.

```
ptdash [options] script.py [args...]      run a script under the dashboard
ptdash [options] -m module [args...]      run a module
ptdash demo [demo args...]                the built-in demo
ptdash attach [RUN]  /  show RUN [RUN...]  re-attach, browse (several runs side by side)
ptdash ls [--all]                         list runs
ptdash runs  /  ptdash                    the runs view: pick runs to open (overlaid)
ptdash fork RUN [--at STEP] [options]     a new run from one of RUN's checkpoints
ptdash ctl [RUN] COMMAND [VALUE]          steer a run from another terminal
ptdash doctor [RUN]                       what the training doctor found
ptdash stacks [RUN]                       where every rank is now (Python stacks)
ptdash export RUN --format csv|jsonl|tensorboard
```

This module parses the arguments, launches the engine and picks the front: the
dashboard, or ``headless`` when stdout is not a terminal. ``subcommands`` holds every
subcommand's arguments, ``ls``, ``ctl``, ``doctor_cli``, ``summary`` and ``export`` the
subcommands. Never imports torch: the dashboard's first frame must not wait for it.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
from pathlib import Path

from ptdash.shared import __version__, frontlink, perms, rundir
from ptdash.shared.config import ConfigError, RunConfig
from ptdash.shared.exits import shell_status
from ptdash.shared.protocol import TransportError

from . import checks, nodeopts, options, runs, subcommands
from .ctl import cmd_ctl
from .errors import CliError
from .headless import headless, say
from .ls import cmd_ls
from .nodefront import follow_node
from .notify import watcher as notify_watcher
from .options import (
    NO_TERMINAL_PAUSE_TIMEOUT,
    count_arg,
    duration_arg,
    every_arg,
    has_terminal,
    positive_arg,
    setting_arg,
    steps_arg,
)

SUBCOMMANDS = ("demo", "attach", "show", "ls", "ctl", "doctor", "export", "stacks", "fork", "runs")


def _run_parser() -> argparse.ArgumentParser:
    p = subcommands.Parser(
        prog="ptdash",
        allow_abbrev=False,  # ``--over 5`` would be a guess; the script's options are never ours
        description="Run a PyTorch training script with a live terminal dashboard.",
        usage="ptdash [options] (script.py | -m module | demo) [args...]\n"
              "       ptdash attach [RUN] | show RUN [RUN...] | ls | runs | doctor [RUN] | ctl [RUN] COMMAND [VALUE]\n"
              "       ptdash export RUN --format csv|jsonl|tensorboard [-o PATH]\n"
              "       ptdash fork RUN [--at STEP | --from CKPT] [options]",
        epilog="Each subcommand has --help (ptdash show --help). Keys in the dashboard: space pause/resume, "
               "c checkpoint, g clip norm, l LR factor, p profile, s stop, q quit, + - 0 zoom, , . cursor, "
               "e smoothing, y y scale auto/log/linear, ? help.")
    p.add_argument("--version", action="version", version=f"ptdash {__version__}")
    p.add_argument("-m", dest="module", metavar="MODULE", help="run a library module as a script")
    p.add_argument("--headless", action="store_true",
                   help="no dashboard: print the script's output and a progress line every few seconds "
                        "(automatic when stdout is not a terminal)")
    p.add_argument("--name", help="run name (default: the script's name)")
    p.add_argument("--run-dir", type=Path, help="directory for this run (default: ./ptdash-runs/<time>-<name>)")
    p.add_argument("--share-group", metavar="GROUP",
                   help="let GROUP read the run (dir 2750, files 0640); by default only you can (0700, 0600)")
    p.add_argument("--clip", type=setting_arg("clip"), metavar="X",
                   help="clip the gradient norm at X from the start (1e-6 to 1e6)")
    p.add_argument("--lr-scale", type=setting_arg("lr_scale"), metavar="X",
                   help="multiply every LR by X (1e-6 to 1000; a script with no torch.optim optimizer "
                        "gets a warning at its first step instead)")
    p.add_argument("--checkpoint-every", type=every_arg, metavar="N|30m",
                   help="save a checkpoint every N steps, or every so many minutes/hours (30m, 2h)")
    p.add_argument("--keep-last", type=count_arg(1), metavar="K", help="keep only the newest K checkpoints")
    p.add_argument("--steps", type=count_arg(1), metavar="N",
                   help="the run's length in optimizer steps, for the total and ETA when its schedule "
                        "does not say (display only)")
    p.add_argument("--resume", type=Path, metavar="CKPT", help="resume from a ptdash checkpoint")
    options.add_anomaly_arguments(p)
    p.add_argument("--pause-timeout", type=duration_arg, metavar="DURATION",
                   help="stop cleanly (with a checkpoint) when a pause lasts DURATION with nobody resuming it: "
                        "seconds, or 30m, 2h; 'none' waits for ever (default: 30m for a headless run with no "
                        "terminal, none otherwise)")
    p.add_argument("--profile-steps", type=steps_arg, metavar="A:B",
                   help="profile optimizer steps A to B with torch.profiler")
    p.add_argument("--memory-history", action="store_true",
                   help="record CUDA allocations; on out-of-memory, save a snapshot for PyTorch's memory viewer")
    p.add_argument("--update-ratio-every", type=count_arg(0), default=100, metavar="K",
                   help="measure each parameter's update/weight ratio every K steps (0: never; default 100)")
    p.add_argument("--overhead-budget", type=positive_arg("overhead budget"), default=1.0, metavar="PCT",
                   help="ptdash's share of the step time, in percent (default 1; 100 = never thin the statistics)")
    p.add_argument("--nproc-per-node", type=count_arg(1), default=1, metavar="N",
                   help="launch N ranks through torch.distributed's launcher (DDP), on each node")
    nodeopts.add_arguments(p)
    options.add_notify_arguments(p)
    p.add_argument("--detect-anomaly", action="store_true",
                   help="turn on autograd anomaly detection (slow): a failing backward names the forward "
                        "line that caused it")
    p.add_argument("--no-parse-output", dest="parse_output", action="store_false",
                   help="do not read the metrics the script prints (val loss 2.29, {'eval_loss': ...}, a bar's "
                        "postfix) into printed/<name> series")
    p.add_argument("--stall-timeout", type=positive_arg("stall timeout"), default=120, metavar="S",
                   help="name a rank that makes no step for S seconds (default 120)")
    p.add_argument("--flush-interval", type=positive_arg("flush interval"), default=None, metavar="S",
                   help="seconds between metric flushes (default 0.25, or 1 while the cost budget thins "
                        "the sampling of fast steps)")
    p.add_argument("target", nargs=argparse.REMAINDER, help="script (or module) and its arguments")
    return p


# -------------------------------------------------------------------------- running


def launch(args: argparse.Namespace, target: list[str], name: str,
           link: socket.socket | None = None) -> tuple[Path, subprocess.Popen]:
    """Create the run dir and start the engine in its own session; ``link`` is the engine's
    end of a headless front's link (see shared/frontlink.py). A headless run (``link``
    given) reads ptdash's stdin, as the script would under python (``echo 3 | ptdash s.py``,
    a ``breakpoint()``); under the dashboard, which owns the terminal, it reads nothing."""
    every = {}
    if args.checkpoint_every:
        kind, value = args.checkpoint_every
        every = {"checkpoint_every" if kind == "steps" else "checkpoint_every_s": value}
    if args.resume:
        checks.checkpoint(args.resume)
    try:
        config = RunConfig(
            clip=args.clip, lr_scale=args.lr_scale, keep_last=args.keep_last,
            resume=str(args.resume.resolve()) if args.resume else None, flush_interval=args.flush_interval,
            on_anomaly=args.on_anomaly, profile_steps=args.profile_steps, memory_history=args.memory_history,
            update_ratio_every=args.update_ratio_every, stall_seconds=args.stall_timeout,
            detect_anomaly=args.detect_anomaly, steps=args.steps,
            overhead_budget=args.overhead_budget, parse_output=args.parse_output,
            rollback_every=args.rollback_every, rollback_memory=args.rollback_memory,
            rollback_lr=args.rollback_lr, rollback_limit=args.rollback_limit,
            pause_timeout=getattr(args, "pause_timeout", None) or None, **every)
    except ConfigError as exc:
        raise CliError(str(exc), 2) from None
    try:
        group = perms.group_id(args.share_group) if args.share_group else None
    except ValueError as exc:
        raise CliError(f"--share-group: {exc}", 2) from None
    fields = dict(argv=target, cwd=os.getcwd(), python=sys.executable, config=config, group=group,
                  git=checks.git_commit(target), ptdash_version=__version__, total_steps=args.steps, **args.lineage)
    nodes = getattr(args, "nodes", None)
    if args.run_dir and (nodes is None or nodes.hub):  # another node's dir goes beside it (a shared home)
        checks.run_dir(args.run_dir)
    else:
        checks.run_dir(args.run_dir.parent if args.run_dir else Path(rundir.DEFAULT_ROOT), root=True)
    try:
        if nodes is not None and not nodes.hub:  # the run dir is node 0's: this node gets its own
            run_dir = rundir.create_node_dir(args.run_dir.parent if args.run_dir else Path(rundir.DEFAULT_ROOT),
                                             args.run_dir.name if args.run_dir else args.name or name,
                                             nodes.node_rank, **fields)
        elif args.run_dir:
            run_dir = rundir.create(args.run_dir.parent, args.run_dir.name, exact=True, **fields)
        else:
            run_dir = rundir.create(Path(rundir.DEFAULT_ROOT), args.name or name, **fields)
    except TransportError:
        raise  # an unsafe private dir: its own one-line reason
    except OSError as exc:  # what the checks could not foresee (a full disk, a race)
        where = f" ({exc.filename})" if exc.filename else ""
        raise CliError(f"cannot create the run dir: {exc.strerror or exc}{where}", 1) from None
    # The engine relays the script's output to output.log itself, so a full disk never fails a print.
    env = dict(os.environ, PTDASH_RUN_DIR=str(run_dir), PYTHONUNBUFFERED="1")
    launched = args.nproc_per_node > 1 or nodes is not None
    # Each rank relays its own output (on another node than the hub's, into its launcher's
    # pipe to the hub, noderelay.py): read for its metrics at its own steps.
    env["PTDASH_OUTPUT_RELAY"] = "1"
    pass_fds: tuple[int, ...] = ()
    if link is not None and not launched:
        env[frontlink.ENV] = str(link.fileno())
        pass_fds = (link.fileno(),)
    if nodes is not None and nodes.link_port:
        env["PTDASH_LINK_PORT"] = str(nodes.link_port)
    # On another node than the hub's, the launcher sends its ranks' output to the hub (and
    # prints where the run is on this node's stdout): output.log is node 0's.
    output = None if nodes is not None and not nodes.hub else \
        os.fdopen(perms.open_file(run_dir / "output.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND), "ab")
    if launched:
        command = [sys.executable, "-m", "ptdash.launch", "--nproc-per-node", str(args.nproc_per_node),
                   *(nodes.launcher_args() if nodes is not None else ()), "--", *target]
    else:
        command = [sys.executable, "-m", "ptdash.bootstrap", *target]
    proc = subprocess.Popen(
        command,
        stdin=None if link is not None else subprocess.DEVNULL, stdout=output,
        stderr=None if output is None else subprocess.STDOUT, env=env, pass_fds=pass_fds,
        # Its own session: closing the terminal (SIGHUP) or Ctrl-C here never reaches training.
        start_new_session=True)
    if output is not None:
        output.close()
    rundir.update_info(run_dir, pid=proc.pid, launcher_pid=proc.pid, nproc_per_node=args.nproc_per_node)
    if args.notify and (nodes is None or nodes.hub):  # one notifier a run: node 0's
        notify_watcher.start(run_dir, args.notify, args.notify_on)
    return run_dir, proc


def dashboard(run_dir: Path, proc: subprocess.Popen | None, live: bool = True, compare: tuple[Path, ...] = (),
              by_time: bool = False, terminal_notify: bool = True) -> int:
    """Run the Textual app on a run (``compare``: runs drawn behind it, by default a fork's
    parent); return the exit status."""
    from .app import make_app
    from .compare import Comparison
    from .source.live import LiveSource
    from .source.replay import ReplaySource

    source = LiveSource(run_dir) if live else ReplaySource(run_dir)
    compare = compare or runs.parent_of(run_dir)
    result = make_app(source, comparison=Comparison(compare, by_time), terminal_notify=terminal_notify).run()
    if result == "detach":
        print(f"Training continues in the background. Re-attach with: ptdash attach {run_dir}")
        return 0
    if proc is not None:
        if result == "stop":
            print("Stopping training cleanly...", flush=True)
        if result in ("stop", "closed") or proc.poll() is not None:
            return shell_status(proc.wait())
    info = rundir.read_info(run_dir)
    return int(info.exit_code or 0)


# ------------------------------------------------------------------- subcommands


def cmd_open(sub: str, args: argparse.Namespace) -> int:
    """``ptdash show`` and ``ptdash attach``: the dashboard, or the plain summary without a terminal.

    A screen drawn into a file would be escape codes that never end, so with stdout not
    a terminal (or ``--once``/``--json``) the runs are summed up and the command exits.
    """
    if sub == "show":
        main, *others = (runs.resolve(r, everywhere=True) for r in args.runs)
    else:
        main = runs.resolve(args.run, live_only=not args.run)
        others = [runs.resolve(r, everywhere=True) for r in args.compare]
    if args.once or args.json or not sys.stdout.isatty():
        from .summary import print_summaries

        return print_summaries([main, *others], args.json)
    return dashboard(main.path, None, live=sub == "attach" and main.live, compare=tuple(o.path for o in others),
                     by_time=args.by_time, terminal_notify=getattr(args, "terminal_notify", True))


def cmd_runs(args: argparse.Namespace) -> int:
    """``ptdash runs`` (and ``ptdash`` alone at a terminal): the runs view, then the runs chosen
    in it, overlaid as ``show`` draws them (one live run alone: attached)."""
    if not sys.stdout.isatty():
        return cmd_ls(subcommands.parse("ls", ["--all"] if args.all else []))
    from .runsview import run_rows
    from .widgets.runs_app import RunsApp

    chosen = RunsApp(run_rows(runs.all_runs(everywhere=args.all))).run() or []
    if not chosen:
        return 0
    main, *others = (runs.resolve(str(path)) for path in chosen)
    return dashboard(main.path, None, live=main.live and not others, compare=tuple(o.path for o in others))


def _demo_help(script: str) -> int:
    """``ptdash demo --help``: ptdash's word on the demo, then the demo script's own options."""
    print(subcommands.parser("demo").format_help())
    print("The demo script's own options:", flush=True)
    # Its own process: the demo's argparse imports torch, which the terminal side never does.
    return subprocess.run([sys.executable, script, "--help"]).returncode


def main(argv: list[str] | None = None) -> int:
    """The ``ptdash`` entry point: run ``argv`` (default: the command line) and return the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        return _main(argv)
    except CliError as exc:
        print(f"ptdash: error: {exc}", file=sys.stderr)
        return exc.code
    except BrokenPipeError:  # `ptdash ls --json | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (LookupError, OSError, ValueError, TransportError) as exc:  # OSError: another user's files
        message = str(exc).strip('"').splitlines()
        print(f"ptdash: error: {message[0] if message else type(exc).__name__}", file=sys.stderr)
        return 1


def _first_positional(argv: list[str]) -> int | None:
    """Index of the first argument that is not an option or an option's value (None after ``-m``)."""
    i = _script_start(argv)
    if i == len(argv) or "-m" in argv[:i]:
        return None
    return i if argv[i - 1:i] != ["--"] else None


def _script_start(argv: list[str]) -> int:
    """Where ptdash's options end: at the script's path, or after ``-m MODULE`` (or ``--``).
    What follows is the script's, never parsed as ptdash's (its ``--n 5`` is not taken for
    an abbreviation of ``--name``)."""
    takes_value = {opt for action in _run_parser()._actions if action.nargs != 0 and action.option_strings
                   for opt in action.option_strings}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "-m":
            return min(i + 2, len(argv)) if i + 1 < len(argv) else i
        if arg == "--":
            return i + 1
        if not arg.startswith("-"):
            return i
        i += 2 if arg in takes_value else 1
    return len(argv)


def _main(argv: list[str]) -> int:
    if not argv and sys.stdout.isatty() and sys.stdin.isatty():  # `ptdash` alone, at a terminal
        return cmd_runs(subcommands.parse("runs", []))
    first, lineage = _first_positional(argv), {}
    if first is not None and argv[first] in SUBCOMMANDS and not Path(argv[first]).is_file():
        sub, rest = argv[first], argv[first + 1:]
        options = argv[:first]
        if options and sub != "demo":
            raise CliError(f"{options[0]} is not an option of ptdash {sub} here: its options go after it "
                           f"(see ptdash {sub} --help)")
        if sub == "ls":
            return cmd_ls(subcommands.parse("ls", rest))
        if sub == "runs":
            return cmd_runs(subcommands.parse("runs", rest))
        if sub == "ctl":
            return cmd_ctl(rest)
        if sub == "doctor":
            from .doctor_cli import cmd_doctor

            return cmd_doctor(rest)
        if sub == "stacks":
            from .stacks_cli import cmd_stacks

            return cmd_stacks(rest)
        if sub == "export":
            from .export import cmd_export

            return cmd_export(subcommands.parse("export", rest))
        if sub in ("attach", "show"):
            return cmd_open(sub, subcommands.parse(sub, rest))
        if sub == "fork":  # a plain run of the parent's script from its checkpoint, in its directory
            from .fork import prepare

            argv, lineage = prepare(rest, _run_parser())
        if sub == "demo":
            from importlib.util import find_spec

            demo = find_spec("ptdash.demo.train")
            if demo is None or demo.origin is None:
                raise CliError("the demo is not installed", 1)
            if "-h" in rest or "--help" in rest:  # before any run dir is made
                return _demo_help(demo.origin)
            argv = [*options, "--name", "demo", demo.origin, *rest] if "--name" not in options \
                else [*options, demo.origin, *rest]
    start = _script_start(argv)
    args = _run_parser().parse_args(argv[:start])
    args.target, args.lineage = argv[start:], lineage
    target, name = checks.target(args.target, args.module)
    args.nodes = nodeopts.resolve(args, os.environ)
    if args.nodes is not None and not args.nodes.hub:
        return follow_node(args.nodes, *launch(args, target, name))
    if not (args.headless or not sys.stdout.isatty()):
        return dashboard(*launch(args, target, name), terminal_notify=args.terminal_notify)
    if args.pause_timeout is None and not has_terminal():
        args.pause_timeout = NO_TERMINAL_PAUSE_TIMEOUT  # a batch job must not wait for ever
    # The link tells the engine when this front dies without detaching (see headless.py).
    front, engine_end = frontlink.pair()
    try:
        run_dir, proc = launch(args, target, name, link=engine_end)
    finally:
        engine_end.close()
    if args.nproc_per_node > 1 or args.nodes is not None:
        front.close()
        front = None
    say(f"[ptdash] run dir: {run_dir}")
    return shell_status(headless(run_dir, proc, link=front, pause_timeout=args.pause_timeout or None))


if __name__ == "__main__":
    sys.exit(main())
