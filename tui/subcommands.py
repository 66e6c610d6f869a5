"""The arguments of every ``ptdash`` subcommand: one argparse parser each.

So that each has ``--help`` (its usage, options and what it prints, then exit 0), and a
bad or unknown argument is one line naming the subcommand's ``--help`` and exit status 2
(a ``CliError``), never argparse's usage dump. The subcommands themselves live in their
own modules; this one only says what they accept.
"""

from __future__ import annotations

import argparse

from ptdash.shared.limits import parse_positive

from .errors import CliError

LS_STATES = ("live", "stalled", "paused", "starting", "stopping", "finished", "crashed", "stopped", "lost")
"""The states ``ptdash ls`` shows (and ``--state`` filters on)."""

EXPORT_FORMATS = ("csv", "jsonl", "tensorboard")

CTL_HELP = """commands:
  pause | resume        pause at the next step boundary, or go on
  checkpoint            save a checkpoint now (checkpoints/step-N.pt)
  clip X | clip off     clip the total gradient norm at X, or give clipping back to the script
  lr-scale X            multiply every param group's scheduled LR by X (refused when the
                        script has no torch.optim optimizer: its LR is its own variable)
  profile N             profile the next N steps with torch.profiler
  stop | kill           stop cleanly (checkpoint, the script's finally blocks), or kill at once
  stacks                every rank's Python stacks now, side by side (as ptdash stacks)

The engine answers with the step the command took effect at. Exit status: 0 when
applied, 1 when refused or unanswered, 2 on bad usage."""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (a CliError, exit status 2)."""

    def error(self, message: str):
        raise CliError(f"{message} (see {self.prog} --help)")


def _states(text: str) -> list[str]:
    states = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in states if s not in LS_STATES]
    if not states or unknown:
        raise argparse.ArgumentTypeError(f"{text!r} is not a state; use one or more of {', '.join(LS_STATES)}")
    return states


def _seconds(text: str) -> float:
    try:
        return parse_positive(text, "--timeout")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _parser(name: str, description: str, epilog: str | None = None) -> Parser:
    return Parser(prog=f"ptdash {name}", description=description, epilog=epilog,
                  formatter_class=argparse.RawDescriptionHelpFormatter)


RUN_HELP = "a run dir, or part of a run's name or id"


def _ls() -> Parser:
    p = _parser("ls", "List runs: those under ./ptdash-runs and the live ones anywhere, oldest first.")
    p.add_argument("--all", action="store_true",
                   help="also every finished run anywhere you ran one (the per-user list of runs)")
    p.add_argument("--state", type=_states, metavar="STATE[,STATE]",
                   help=f"only runs in these states ({', '.join(LS_STATES)})")
    p.add_argument("--name", metavar="TEXT", help="only runs whose name or dir contains TEXT")
    p.add_argument("--json", action="store_true", help="print a JSON array of runs instead of a table")
    return p


def _show() -> Parser:
    p = _parser("show", "Open finished (or live) runs read-only. Several runs are drawn side by side: their\n"
                        "loss, LR and gradient-norm charts overlaid, and a table of each run's key figures.\n"
                        "Without a terminal (stdout redirected) this prints the summary of --once.")
    p.add_argument("runs", nargs="+", metavar="RUN", help=RUN_HELP + "; the first is the main one")
    p.add_argument("--by-time", action="store_true",
                   help="align compared runs by elapsed time instead of by step (key t toggles)")
    p.add_argument("--once", action="store_true",
                   help="print a plain-text summary and exit (status, steps, loss, LR, grad norms, findings)")
    p.add_argument("--json", action="store_true", help="the summary of --once as a JSON object (implies --once)")
    return p


def _attach() -> Parser:
    p = _parser("attach", "Re-attach the dashboard to a live run (default: the one live run here, else\n"
                          "your only live run anywhere; with several, they are listed).\n"
                          "Without a terminal (stdout redirected) this prints the run's state now, as --once.")
    p.add_argument("run", nargs="?", metavar="RUN", help=RUN_HELP)
    p.add_argument("--compare", action="append", default=[], metavar="OTHER",
                   help="draw this run behind the live one, as a reference (repeatable)")
    p.add_argument("--by-time", action="store_true",
                   help="align the reference runs by elapsed time instead of by step (key t toggles)")
    p.add_argument("--no-terminal-notify", dest="terminal_notify", action="store_false",
                   help="no desktop notification (OSC 9/777) and no bell when the run ends, pauses, rolls back "
                        "or stalls (key n toggles)")
    p.add_argument("--once", action="store_true", help="print the run's state now as plain text and exit")
    p.add_argument("--json", action="store_true", help="the summary of --once as a JSON object (implies --once)")
    return p


def _doctor() -> Parser:
    p = _parser("doctor", "Print what the training doctor found in a run: silent bugs such as gradients never\n"
                          "cleared, training in eval mode, parameters that never learn, a zero learning rate.",
                "Exit status: 0 when there are no findings, 1 when there are (or on an error), 2 on bad usage.")
    p.add_argument("run", nargs="?", metavar="RUN", help=RUN_HELP + " (default: the newest run)")
    p.add_argument("--json", action="store_true", help="print the findings as a JSON object")
    return p


def _ctl() -> Parser:
    p = _parser("ctl", "Steer a live run from another terminal or a script, as the dashboard's keys do.", CTL_HELP)
    p.usage = "ptdash ctl [-h] [--json] [RUN] COMMAND [VALUE]"
    p.add_argument("words", nargs="*", metavar="[RUN] COMMAND [VALUE]", help="the run (default: the one live "
                   "run here, else your only live run anywhere), the command and its value")
    p.add_argument("--json", action="store_true", help="print the engine's answer as a JSON object")
    return p


def _stacks() -> Parser:
    p = _parser("stacks", "Print where every rank of a live run is now: each thread's Python stack (the training\n"
                          "thread first), taken by each rank's engine from a thread of its own, shown side by\n"
                          "side with the frames common to every rank folded and the frame where ranks differ\n"
                          "marked. A rank that cannot answer is named with its last step and /proc state.",
                "Exit status: 0 with every rank's stacks, 1 when some rank did not answer, 2 on bad usage.")
    p.add_argument("run", nargs="?", metavar="RUN", help=RUN_HELP + " (default: the one live run)")
    p.add_argument("--json", action="store_true", help="print the ranks' stacks as a JSON object")
    p.add_argument("--timeout", type=_seconds, default=10.0, metavar="S",
                   help="seconds to wait for the engine's answer (default 10)")
    return p


def _fork() -> Parser:
    p = _parser("fork", "Start a new run from one of RUN's checkpoints: RUN's script, arguments, working\n"
                        "directory and options, with any option given here changed (--lr-scale, --clip, ...).\n"
                        "The new run names its parent and the step it forked at (run.json, ls, show --once),\n"
                        "continues from the step after it, and its dashboard draws the parent behind it.",
                "Any option of a run (see ptdash --help) may follow RUN and replaces the parent's; the\n"
                "live clip and LR factor come from the checkpoint unless --clip or --lr-scale is given.")
    p.usage = "ptdash fork [-h] RUN [--at STEP | --from CKPT] [run options]"
    p.add_argument("run", metavar="RUN", help=RUN_HELP + ": the parent")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--at", type=_step, metavar="STEP",
                       help="fork at the checkpoint RUN saved at step STEP (default: its newest)")
    where.add_argument("--from", dest="source", metavar="CKPT",
                       help="fork from this checkpoint file (a path, or a file name in RUN's checkpoints/)")
    return p


def _step(text: str) -> int:
    try:
        step = int(text)
    except ValueError:
        step = -1
    if step < 0:
        raise argparse.ArgumentTypeError(f"a step is a whole number >= 0, got {text!r}")
    return step


def _export() -> Parser:
    p = _parser("export", "Write a run's history in a format other tools read. Streams the store in windows\n"
                          "of steps, so a run of millions of steps exports in bounded memory; progress on stderr.",
                "formats:\n"
                "  csv          one row per step, one column per scalar series (rankN/ columns under DDP)\n"
                "  jsonl        one JSON object per step; with --events also the events and the command journal\n"
                "  tensorboard  event files for `tensorboard --logdir` (scalars under their ptdash names,\n"
                "               events as text); needs `pip install 'ptdash[tensorboard]'`")
    p.add_argument("run", metavar="RUN", help=RUN_HELP)
    p.add_argument("--format", required=True, choices=EXPORT_FORMATS)
    p.add_argument("-o", "--output", metavar="PATH",
                   help="file (csv, jsonl; default: stdout) or directory (tensorboard; default: ./tb/<run>)")
    p.add_argument("--layers", action="store_true",
                   help="also each parameter's gradient norm and update ratio (layer/<name>/... series)")
    p.add_argument("--events", action="store_true", help="jsonl: also the events and the command journal")
    p.add_argument("--samples", action="store_true",
                   help="the host and GPU readings (taken once a second, by time): csv writes them instead of "
                        "the steps (wall, rank, one column each); jsonl adds them in time order among the steps "
                        "({\"sample\": wall, ...}); tensorboard always has them")
    return p


def _runs() -> Parser:
    p = _parser("runs", "The runs view: this directory's runs (and the live ones anywhere) in the terminal, newest\n"
                        "first: / filters, space marks, enter opens the marked runs overlaid (as show A B).\n"
                        "Plain `ptdash` at a terminal opens it too. Without a terminal this prints `ptdash ls`.")
    p.add_argument("--all", action="store_true", help="every run you created, wherever it is (as ls --all)")
    return p


def _demo() -> Parser:
    return _parser("demo", "Run the built-in demo: a small GPT learning to write English, on CPU or GPU.\n"
                           "usage: ptdash [options] demo [demo options]  (ptdash's options go before `demo`)")


PARSERS = {"ls": _ls, "show": _show, "attach": _attach, "doctor": _doctor, "ctl": _ctl, "export": _export,
           "stacks": _stacks, "demo": _demo, "fork": _fork, "runs": _runs}


def parser(name: str) -> Parser:
    """The parser of subcommand ``name``."""
    return PARSERS[name]()


def parse(name: str, argv: list[str]) -> argparse.Namespace:
    """``argv`` parsed as subcommand ``name``'s arguments; ``--help`` prints and exits 0."""
    return parser(name).parse_args(argv)
