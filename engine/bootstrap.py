"""The engine process's entry point: install the engine, then run the script as __main__.

``python -m ptdash.bootstrap [-m] TARGET [ARGS...]`` with ``PTDASH_RUN_DIR`` set (the
``ptdash`` command does this). The script sees the ``sys.argv``, ``sys.path[0]`` and
working directory that ``python TARGET ARGS`` would give it. The exit status is the
script's.
"""

from __future__ import annotations

import atexit
import builtins
import functools
import importlib.machinery
import io
import os
import runpy
import sys
import threading
import traceback
import types
import zipfile
from pathlib import Path

from .enginelog import setup_logging
from .invisible import script_traceback
from .shared.config import RunConfig

END_WAIT_S = 10.0
"""How long a script's ``os._exit`` waits for the run's end to be recorded."""


def run_target(argv: list[str]) -> dict:
    """Run ``argv`` (``[script, args...]`` or ``["-m", module, args...]``) as __main__,
    exactly as ``python`` would: the same ``sys.argv``, ``sys.path[0]``, ``__file__``
    (absolute), module attributes and, for ``-m``, runpy's own frames in a traceback."""
    if argv[0] == "-m":
        module, args = argv[1], argv[2:]
        sys.argv = [module, *args]
        sys.path[0] = os.getcwd()
        # What `python -m` itself calls: it sets argv[0] to the module's file, and a
        # missing module exits with python's one line.
        runpy._run_module_as_main(module, alter_argv=True)
        return sys.modules["__main__"].__dict__
    script, args = argv[0], argv[1:]
    path = os.path.abspath(script)
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(os.path.realpath(script))
    if os.path.isdir(path) or zipfile.is_zipfile(path):  # a directory or zip with __main__.py
        return runpy.run_path(path, run_name="__main__")
    with io.open_code(path) as f:
        code = compile(f.read(), path, "exec", dont_inherit=True)
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=path, __cached__=None, __builtins__=builtins, __spec__=None,
                         __loader__=importlib.machinery.SourceFileLoader("__main__", path))
    # In sys.modules, as python has it: pickling the script's classes and DataLoader
    # workers started with spawn find the script there.
    sys.modules["__main__"] = main
    exec(code, main.__dict__)
    return main.__dict__


def print_crash(exc: BaseException) -> str:
    """Show the script's uncaught exception as python would, through ``sys.excepthook``
    (the script may have set its own), without ptdash's frames; return its text."""
    script_traceback(exc)
    sys.excepthook(type(exc), exc, exc.__traceback__)
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


def _run_dir(argv: list[str]) -> tuple[Path | None, RunConfig]:
    """The run dir and its config: the one ``ptdash`` made, or a new one (rank 0 under a
    plain ``torchrun -m ptdash.bootstrap``, which the other ranks of that job find through
    the user's private directory); None for a rank that finds none."""
    from . import nodes
    from .shared import rundir

    rank = int(os.environ.get("RANK", 0))
    job = os.environ.get("TORCHELASTIC_RUN_ID")
    if "PTDASH_RUN_DIR" in os.environ:
        run_dir = Path(os.environ["PTDASH_RUN_DIR"])
    elif rank == 0:
        name = Path(argv[1] if argv[0] == "-m" else argv[0]).stem
        run_dir = rundir.create(Path(rundir.DEFAULT_ROOT), name, argv=argv, cwd=os.getcwd(), python=sys.executable)
        print(f"ptdash: run dir {run_dir}; watch it with: ptdash attach {run_dir}", file=sys.stderr, flush=True)
        if job:
            rundir.announce_job(job, run_dir)
    elif job and (where := nodes.place()) is not None and where.remote and os.environ.get("LOCAL_RANK") == "0":
        # A node other than rank 0's, under the user's own torchrun: this node's own dir,
        # found by its other ranks as the run dir is on node 0 (the hub is reached over TCP).
        name = Path(argv[1] if argv[0] == "-m" else argv[0]).stem
        run_dir = rundir.create_node_dir(Path(rundir.DEFAULT_ROOT), name, where.node, argv=argv, cwd=os.getcwd(),
                                         python=sys.executable)
        rundir.announce_job(job, run_dir)
        atexit.register(rundir.forget_job, job)
    else:
        run_dir = rundir.find_job(job) if job else None
        if run_dir is None:
            print(f"ptdash: rank {rank} found no run dir of its job: it runs without ptdash", file=sys.stderr,
                  flush=True)
            return None, RunConfig()
    os.environ["PTDASH_RUN_DIR"] = str(run_dir)
    # Every rank logs to the run's engine.log: a rank with no handler would have logging's
    # last resort print its errors into the script's output.
    setup_logging(run_dir)
    return run_dir, rundir.read_info(run_dir).config


def _hand_down(primary: bool) -> None:
    """What the script's own processes inherit: the start-up hook that finds the ranks it
    starts (``ptdash/startup``), and who the hub is. A rank that ptdash's launcher started
    dies with it."""
    from .rankstart import die_with_parent, wrap_init_in_hub
    from .startup import STARTUP_DIR

    if primary:
        os.environ["PTDASH_HUB_PID"] = str(os.getpid())
        wrap_init_in_hub()
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(STARTUP_DIR)]
    os.environ["PYTHONPATH"] = os.pathsep.join([str(STARTUP_DIR), *paths])
    launcher = os.environ.get("PTDASH_LAUNCHER_PID")
    if launcher and launcher.isdigit():
        die_with_parent(int(launcher))


def main() -> int:
    from .unattended import EarlySignals

    early = EarlySignals()  # a SIGTERM while torch imports is a stop, not a death
    from . import unattended
    from .checkpoint_format import ResumeError
    from .controls import StopTraining
    from .engine import Engine
    from .output import OutputRelay
    from .outtap import OutputTap
    from .shared import rundir
    from .shared.frontlink import EngineLink

    argv = sys.argv[1:]
    if not argv:
        print("usage: python -m ptdash.bootstrap [-m MODULE | SCRIPT] [ARGS...]", file=sys.stderr)
        return 2
    run_dir, config = _run_dir(argv)
    link = EngineLink.from_env()
    relay = OutputRelay.start(run_dir, link, parse=config.parse_output)
    try:
        engine = Engine(run_dir, config)
        if relay is not None:
            relay.follow(engine.printed, engine.hooks.state)
        elif run_dir is not None:  # your own torchrun's fds, left as they are: the prints read (outtap.py)
            relay = OutputTap.start(engine.printed, engine.hooks.state)
        if run_dir is not None:
            _hand_down(engine.primary)
        engine.start()
    except Exception as exc:
        print(f"ptdash: {exc}", file=sys.stderr)
        if relay is not None:
            relay.close()
        if run_dir is not None and int(os.environ.get("RANK", 0)) == 0:
            rundir.update_info(run_dir, status="crashed", exit_code=1, error=str(exc))
        return 1
    guard = unattended.attach(engine, link, early)
    ended = threading.Lock()

    def end(state: str, code: int, detail: str) -> None:
        """Record the run's end, once (the script's return, or its ``os._exit``)."""
        if not ended.acquire(blocking=False):
            return
        guard.close()
        if relay is not None:
            relay.close()
        unattended.finish(engine, run_dir, state, code, detail, guard)
        if link is not None:
            link.close()

    real_exit = os._exit
    os._exit = _exit_through(real_exit, end, lambda: engine.journal.state == "stopping")
    state, code, detail = "finished", 0, ""
    # The script's globals outlive it until the engine has finished, so a checkpoint due
    # at the very end still finds the model and optimizer.
    script_globals: dict = {}
    try:
        script_globals = run_target(argv)
    except StopTraining:
        state = "stopped"
    except ResumeError as exc:  # the checkpoint does not fit: one line, not a traceback
        print(f"ptdash: {exc}", file=sys.stderr)
        state, code, detail = "crashed", exc.code, str(exc)
    except SystemExit as exc:
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code
        else:
            print(exc.code, file=sys.stderr)
            code = 1
        if code:
            state, detail = "crashed", f"the script exited with code {code}"
    except KeyboardInterrupt as exc:
        print_crash(exc)
        state, code, detail = "stopped", 130, "interrupted"
    except BaseException as exc:
        detail = print_crash(exc)
        state, code = "crashed", 1
        engine.on_crash(exc)
    finally:
        os._exit = real_exit
        sys.stdout.flush()
        sys.stderr.flush()
    end(state, code, detail)
    del script_globals
    return code


def _exit_through(real_exit, end, stopping):
    """``os._exit`` for the script: in this process (not a forked DataLoader worker or
    multiprocessing child, whose own exit this is), the end of the run is recorded first,
    as python shows what the script printed before it: the output still in the relay's
    pipe, the steps not yet flushed, run.json's final state. None of the script's own
    cleanup runs, as under python; if recording the end takes over END_WAIT_S, the
    process exits anyway. ``stopping()``: whether a stop was asked for (the script may
    leave this way from its handler of the stop)."""
    owner = os.getpid()

    @functools.wraps(real_exit)
    def _exit(status):
        if os.getpid() == owner:
            deadline = threading.Timer(END_WAIT_S, real_exit, (status,))
            deadline.daemon = True
            deadline.start()
            try:
                for stream in (sys.stdout, sys.stderr):
                    try:
                        stream.flush()
                    except (OSError, ValueError):
                        pass
                end(*_ended_by_exit(status, stopping()))
            except BaseException:  # noqa: BLE001 - the exit must happen whatever ptdash does
                pass
        real_exit(status)

    return _exit


def _ended_by_exit(status, stopping: bool) -> tuple[str, int, str]:
    code = status if isinstance(status, int) else 1
    if code == 0:
        return ("stopped" if stopping else "finished"), 0, ""
    return "crashed", code, f"the script exited with code {code} (os._exit)"


if __name__ == "__main__":
    sys.exit(main())
