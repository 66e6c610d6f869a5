"""The ``ptdash`` command: shaped like ``python`` and ``torchrun``.

```
ptdash [options] script.py [args...]      run a script under the dashboard
ptdash [options] -m module [args...]      run a module
ptdash demo [demo args...]                the built-in demo
ptdash attach [RUN]  /  show RUN  /  ls   re-attach, browse, list
ptdash ctl [RUN] COMMAND [VALUE]          steer a run from another terminal
```

Never imports torch: the dashboard's first frame must not wait for it.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

from ptdash.shared import __version__, rundir
from ptdash.shared.config import ConfigError, RunConfig
from ptdash.shared.protocol import ENDED, Ack, Command, Status, parse_positive
from ptdash.shared.reader import StoreReader, wait_for_store
from ptdash.shared.store import STORE_NAME
from ptdash.shared.transport import Client, TransportError

from . import runs

SUBCOMMANDS = ("demo", "attach", "show", "ls", "ctl", "doctor")


class CliError(Exception):
    """A problem to report as one line, with an exit status."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not argparse's usage dump
        raise CliError(f"{message} (see ptdash --help)")


def _run_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="ptdash",
        description="Run a PyTorch training script with a live terminal dashboard.",
        usage="ptdash [options] (script.py | -m module | demo) [args...]\n"
              "       ptdash attach [RUN] | show RUN | ls | doctor [RUN] | ctl [RUN] COMMAND [VALUE]",
        epilog="Keys in the dashboard: space pause/resume, c checkpoint, g clip norm, l LR factor, "
               "p profile, s stop, q quit, ? help.")
    p.add_argument("--version", action="version", version=f"ptdash {__version__}")
    p.add_argument("-m", dest="module", metavar="MODULE", help="run a library module as a script")
    p.add_argument("--headless", action="store_true",
                   help="no dashboard: print the script's output and a progress line every few seconds "
                        "(automatic when stdout is not a terminal)")
    p.add_argument("--name", help="run name (default: the script's name)")
    p.add_argument("--run-dir", type=Path, help="directory for this run (default: ./ptdash-runs/<time>-<name>)")
    p.add_argument("--clip", type=_clip_arg, metavar="X", help="clip the gradient norm at X from the start")
    p.add_argument("--lr-scale", type=_positive_arg("LR factor"), metavar="X", help="multiply every LR by X")
    p.add_argument("--checkpoint-every", type=_every_arg, metavar="N|30m",
                   help="save a checkpoint every N steps, or every so many minutes/hours (30m, 2h)")
    p.add_argument("--keep-last", type=int, metavar="K", help="keep only the newest K checkpoints")
    p.add_argument("--resume", type=Path, metavar="CKPT", help="resume from a ptdash checkpoint")
    p.add_argument("--on-anomaly", choices=("pause", "skip", "warn"), default="pause",
                   help="on a non-finite loss or gradient: pause before the update (default), skip the "
                        "update, or only warn")
    p.add_argument("--profile-steps", type=_steps_arg, metavar="A:B",
                   help="profile optimizer steps A to B with torch.profiler")
    p.add_argument("--memory-history", action="store_true",
                   help="record CUDA allocations; on out-of-memory, save a snapshot for PyTorch's memory viewer")
    p.add_argument("--update-ratio-every", type=int, default=100, metavar="K",
                   help="measure each parameter's update/weight ratio every K steps (0: never; default 100)")
    p.add_argument("--nproc-per-node", type=int, default=1, metavar="N",
                   help="launch N ranks through torch.distributed's launcher (DDP)")
    p.add_argument("--detect-anomaly", action="store_true",
                   help="turn on autograd anomaly detection (slow): a failing backward names the forward "
                        "line that caused it")
    p.add_argument("--stall-timeout", type=_positive_arg("stall timeout"), default=120, metavar="S",
                   help="name a rank that makes no step for S seconds (default 120)")
    p.add_argument("--flush-interval", type=_positive_arg("flush interval"), default=0.25, metavar="S",
                   help="seconds between metric flushes (default 0.25)")
    p.add_argument("target", nargs=argparse.REMAINDER, help="script (or module) and its arguments")
    return p


def _positive_arg(what: str):
    def parse(text: str) -> float:
        try:
            return parse_positive(text, what)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return parse


def _clip_arg(text: str) -> float | None:
    try:
        return parse_positive(text, "clip norm", allow_off=True)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _steps_arg(text: str) -> tuple[int, int]:
    try:
        a, b = (int(x) for x in text.split(":"))
        if not 1 <= a <= b:
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(f"--profile-steps takes A:B with 1 <= A <= B, got {text!r}") from None
    return a, b


def _every_arg(text: str) -> tuple[str, float]:
    units = {"s": 1, "m": 60, "h": 3600}
    try:
        if text[-1:] in units:
            return ("seconds", parse_positive(text[:-1], "interval") * units[text[-1]])
        steps = int(text)
        if steps <= 0:
            raise ValueError
        return ("steps", steps)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--checkpoint-every takes a step count or a time like 30m, got {text!r}") from None


# -------------------------------------------------------------------------- running


def _check_target(target: list[str], module: str | None) -> tuple[list[str], str]:
    """The bootstrap's argv and the run name; one-line errors for a bad script."""
    if module:
        return ["-m", module, *target], module.rsplit(".", 1)[-1]
    if not target:
        raise CliError("no script given (usage: ptdash [options] script.py [args...])")
    script = target[0]
    if script.startswith("-"):
        raise CliError(f"unrecognized option {script}")
    path = Path(script)
    if not path.is_file():
        raise CliError(f"cannot open script {script!r}: no such file", 2)
    try:
        compile(path.read_bytes(), script, "exec")
    except SyntaxError as exc:
        raise CliError(f"syntax error in {script}, line {exc.lineno}: {exc.msg}", 1) from None
    except ValueError as exc:  # source with null bytes
        raise CliError(f"cannot compile {script}: {exc}", 1) from None
    return list(target), path.stem


def launch(args: argparse.Namespace, target: list[str], name: str) -> tuple[Path, subprocess.Popen]:
    """Create the run dir and start the engine in its own session."""
    every = {}
    if args.checkpoint_every:
        kind, value = args.checkpoint_every
        every = {"checkpoint_every" if kind == "steps" else "checkpoint_every_s": value}
    if args.resume:
        if not args.resume.is_file():
            raise CliError(f"checkpoint {args.resume} does not exist", 2)
    try:
        config = RunConfig(
            clip=args.clip, lr_scale=args.lr_scale, keep_last=args.keep_last,
            resume=str(args.resume.resolve()) if args.resume else None, flush_interval=args.flush_interval,
            on_anomaly=args.on_anomaly, profile_steps=args.profile_steps, memory_history=args.memory_history,
            update_ratio_every=args.update_ratio_every, stall_seconds=args.stall_timeout,
            detect_anomaly=args.detect_anomaly, **every)
    except ConfigError as exc:
        raise CliError(str(exc), 2) from None
    fields = dict(argv=target, cwd=os.getcwd(), python=sys.executable, config=config,
                  git=_git_commit(target), ptdash_version=__version__)
    if args.run_dir:
        if args.run_dir.exists() and any(args.run_dir.iterdir()):
            raise CliError(f"--run-dir {args.run_dir} exists and is not empty", 2)
        run_dir = rundir.create(args.run_dir.parent, args.run_dir.name, exact=True, **fields)
    else:
        run_dir = rundir.create(Path(rundir.DEFAULT_ROOT), args.name or name, **fields)
    env = dict(os.environ, PTDASH_RUN_DIR=str(run_dir), PYTHONUNBUFFERED="1")
    output = open(run_dir / "output.log", "ab")
    if args.nproc_per_node > 1:
        command = [sys.executable, "-m", "ptdash.launch", "--nproc-per-node", str(args.nproc_per_node), "--", *target]
    else:
        command = [sys.executable, "-m", "ptdash.bootstrap", *target]
    proc = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT, env=env,
        # Its own session: closing the terminal (SIGHUP) or Ctrl-C here never reaches training.
        start_new_session=True)
    output.close()
    rundir.update_info(run_dir, pid=proc.pid, launcher_pid=proc.pid, nproc_per_node=args.nproc_per_node)
    return run_dir, proc


def _git_commit(target: list[str]) -> str | None:
    where = Path(target[0]).resolve().parent if target and target[0] != "-m" else Path.cwd()
    try:
        out = subprocess.run(["git", "-C", str(where), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=2)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def headless(run_dir: Path, proc: subprocess.Popen, every: float = 5.0) -> int:
    """Stream the script's output, print a progress line every ``every`` s, return its exit code.

    Ctrl-C asks the engine to stop cleanly; a second Ctrl-C kills it.
    """
    interrupts = 0

    def on_sigint(*_):
        nonlocal interrupts
        interrupts += 1
        name = "stop" if interrupts == 1 else "kill"
        print(f"\n[ptdash] {'stopping cleanly (Ctrl-C again to kill)' if name == 'stop' else 'killing'}",
              flush=True)
        try:
            send_command(run_dir, Command(id=uuid.uuid4().hex[:8], name=name), wait=False)
        except (TransportError, OSError):
            proc.kill()

    previous = signal.signal(signal.SIGINT, on_sigint)
    log_path = run_dir / "output.log"
    offset, last_progress = 0, time.monotonic()
    reader = None
    try:
        while True:
            code = proc.poll()
            offset = _copy_new(log_path, offset)
            if code is not None:
                break
            if time.monotonic() - last_progress >= every:
                reader = reader or wait_for_store(run_dir / STORE_NAME, 0)
                if reader is not None:
                    print(progress_line(reader, rundir.read_info(run_dir)), flush=True)
                last_progress = time.monotonic()
            time.sleep(0.2)
    finally:
        signal.signal(signal.SIGINT, previous)
    info = rundir.read_info(run_dir)
    with wait_for_store(run_dir / STORE_NAME, 1) or _nullcontext() as reader:
        line = progress_line(reader, info) if reader else ""
    print(f"[ptdash] {info.status} with exit code {code}; {line.removeprefix('[ptdash] ')}"
          f"\n[ptdash] run dir: {run_dir}", flush=True)
    return code


class _nullcontext:
    def __enter__(self):
        return None

    def __exit__(self, *_):
        return False


def _copy_new(path: Path, offset: int) -> int:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return offset
    if data:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    return offset + len(data)


def progress_line(reader: StoreReader, info) -> str:
    """``[ptdash] step 1200 | loss 2.3456 | lr 3.00e-04 | 12.3 steps/s``."""
    step, values = reader.latest()
    if step is None:
        return f"[ptdash] {info.status}: no step yet"
    parts = [f"step {step}"]
    if values.get("loss") is not None:
        parts.append(f"loss {values['loss']:.4f}")
    if values.get("opt/lr/group0") is not None:
        parts.append(f"lr {values['opt/lr/group0']:.2e}")
    if values.get("grad/norm_total") is not None:
        parts.append(f"grad norm {values['grad/norm_total']:.3g}")
    steps, walls = reader.walls(after_step=step - 50)
    if len(walls) >= 2 and walls[-1] > walls[0]:
        parts.append(f"{(len(walls) - 1) / (walls[-1] - walls[0]):.1f} steps/s")
    return "[ptdash] " + " | ".join(parts)


def dashboard(run_dir: Path, proc: subprocess.Popen | None, live: bool = True) -> int:
    """Run the Textual app on a run; return the exit status for the ptdash command."""
    from .app import make_app
    from .source.live import LiveSource
    from .source.replay import ReplaySource

    source = LiveSource(run_dir) if live else ReplaySource(run_dir)
    result = make_app(source).run()
    if result == "detach":
        print(f"Training continues in the background. Re-attach with: ptdash attach {run_dir}")
        return 0
    if proc is not None:
        if result == "stop":
            print("Stopping training cleanly...", flush=True)
        if result in ("stop", "closed") or proc.poll() is not None:
            return proc.wait()
    info = rundir.read_info(run_dir)
    return int(info.exit_code or 0)


def send_command(run_dir: Path, cmd: Command, wait: bool = True, timeout: float = 120.0) -> Ack | None:
    """Send one command; with ``wait``, return the engine's Ack for it (None on timeout)."""
    info = rundir.read_info(run_dir)
    client = Client(info.socket, rundir.read_token(run_dir), name="ctl")
    client.connect()
    try:
        client.send(cmd)
        deadline = time.monotonic() + timeout
        while wait and time.monotonic() < deadline:
            msg = client.recv(timeout=max(0.0, deadline - time.monotonic()))
            if isinstance(msg, Ack) and msg.id == cmd.id:
                return msg
            if isinstance(msg, Status) and msg.state in ENDED:
                raise TransportError(f"the run ended ({msg.state}) before answering")
        return None
    finally:
        client.close()


# ------------------------------------------------------------------- subcommands


def cmd_ls() -> int:
    found = runs.all_runs()
    if not found:
        print("no runs here (looked in ./ptdash-runs and the live-run registry)")
        return 0
    print(f"{'RUN':<40} {'STATE':<9} {'STEP':>9} {'AGE':>5}  WHERE")
    for r in found:
        step = "" if r.step is None else f"{r.step:,}"
        host = r.info.host
        where = f"{r.path}" + (f" (on {host})" if host and host != socket.gethostname() else "")
        print(f"{r.path.name[:40]:<40} {r.state:<9} {step:>9} {runs.age(r.started):>5}  {where}")
    return 0


CTL_COMMANDS = {"pause": "pause", "resume": "resume", "checkpoint": "checkpoint", "clip": "clip",
                "lr-scale": "lr_scale", "stop": "stop", "kill": "kill", "profile": "profile"}


def cmd_ctl(argv: list[str]) -> int:
    usage = "usage: ptdash ctl [RUN] pause|resume|checkpoint|clip X|lr-scale X|profile N|stop|kill"
    words = list(argv)
    spec = None
    if words and words[0] not in CTL_COMMANDS:
        spec = words.pop(0)
    if not words or words[0] not in CTL_COMMANDS:
        raise CliError(usage)
    name = CTL_COMMANDS[words.pop(0)]
    value = None
    if name in ("clip", "lr_scale", "profile"):
        if len(words) != 1:
            raise CliError(f"{name.replace('_', '-')} takes one value ({usage})")
        try:
            value = parse_positive(words[0], {"clip": "clip norm", "lr_scale": "LR factor",
                                              "profile": "step count"}[name], allow_off=name == "clip")
        except ValueError as exc:
            raise CliError(str(exc), 1) from None
    elif words:
        raise CliError(f"unexpected {' '.join(words)!r} ({usage})")
    run = runs.resolve(spec, live_only=True)
    cmd = Command(id=uuid.uuid4().hex[:8], name=name, value=value)
    try:
        ack = send_command(run.path, cmd, wait=name != "kill")
    except TransportError as exc:
        raise CliError(str(exc), 1) from None
    if name == "kill":
        print(f"killed {run.path.name}")
        return 0
    if ack is None:
        raise CliError("no answer from the engine in time (is the step very long?)", 1)
    where = f"at step {ack.step}: " if ack.step is not None else ""
    print(f"{name}: {where}{ack.message}" if ack.ok else f"{name} refused: {ack.message}")
    return 0 if ack.ok else 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        return _main(argv)
    except CliError as exc:
        print(f"ptdash: error: {exc}", file=sys.stderr)
        return exc.code
    except (LookupError, FileNotFoundError, ValueError, TransportError) as exc:
        message = str(exc).strip('"').splitlines()
        print(f"ptdash: error: {message[0] if message else type(exc).__name__}", file=sys.stderr)
        return 1


def _first_positional(argv: list[str]) -> int | None:
    """Index of the first argument that is not an option or an option's value."""
    takes_value = {opt for action in _run_parser()._actions if action.nargs != 0 and action.option_strings
                   for opt in action.option_strings}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "-m":
            return None
        if not arg.startswith("-"):
            return i
        i += 2 if arg in takes_value else 1
    return None


def _main(argv: list[str]) -> int:
    first = _first_positional(argv)
    if first is not None and argv[first] in SUBCOMMANDS and not Path(argv[first]).is_file():
        sub, rest = argv[first], argv[first + 1:]
        options = argv[:first]
        if sub == "ls":
            return cmd_ls()
        if sub == "ctl":
            return cmd_ctl(rest)
        if sub == "doctor":
            from .doctor_cli import cmd_doctor

            return cmd_doctor(rest)
        if sub in ("attach", "show"):
            run = runs.resolve(rest[0] if rest else None, live_only=sub == "attach" and not rest)
            return dashboard(run.path, None, live=sub == "attach" and run.live)
        if sub == "demo":
            from importlib.util import find_spec

            demo = find_spec("ptdash.demo.train")
            if demo is None or demo.origin is None:
                raise CliError("the demo is not installed", 1)
            argv = [*options, "--name", "demo", demo.origin, *rest] if "--name" not in options \
                else [*options, demo.origin, *rest]
    args = _run_parser().parse_args(argv)
    target, name = _check_target(args.target, args.module)
    run_dir, proc = launch(args, target, name)
    if args.headless or not sys.stdout.isatty():
        print(f"[ptdash] run dir: {run_dir}", flush=True)
        return headless(run_dir, proc)
    return dashboard(run_dir, proc)


if __name__ == "__main__":
    sys.exit(main())
