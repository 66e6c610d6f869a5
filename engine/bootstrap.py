"""The engine process's entry point: install the engine, then run the script as __main__.

``python -m ptdash.bootstrap [-m] TARGET [ARGS...]`` with ``PTDASH_RUN_DIR`` set (the
``ptdash`` command does this). The script sees the ``sys.argv``, ``sys.path[0]`` and
working directory that ``python TARGET ARGS`` would give it. The exit status is the
script's.
"""

from __future__ import annotations

import logging
import os
import runpy
import sys
import traceback
from pathlib import Path

from .shared.config import RunConfig


def _setup_logging(run_dir: Path) -> None:
    from .shared import perms

    path = run_dir / "engine.log"
    perms.touch(path)  # the run's file mode, not the umask's
    # What a peer sent can reach a log line: an unencodable character must not fail it.
    handler = logging.FileHandler(path, errors="backslashreplace")
    handler.setFormatter(logging.Formatter("%(asctime)s %(threadName)s %(name)s %(levelname)s %(message)s"))
    logger = logging.getLogger("ptdash")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def script_traceback(exc: BaseException) -> str:
    """The traceback as ``python script.py`` would print it: without ptdash's own frames."""
    tb = exc.__traceback__
    own = {os.path.realpath(__file__), os.path.realpath(runpy.__file__)}
    while tb is not None and os.path.realpath(tb.tb_frame.f_code.co_filename) in own:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def run_target(argv: list[str]) -> dict:
    """Run ``argv`` (``[script, args...]`` or ``["-m", module, args...]``) as __main__."""
    if argv[0] == "-m":
        module, args = argv[1], argv[2:]
        sys.argv = [module, *args]
        sys.path[0] = os.getcwd()
        # alter_sys also sets argv[0] to the module's file, as `python -m` does.
        return runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        script, args = argv[0], argv[1:]
        sys.argv = [script, *args]
        sys.path[0] = os.path.dirname(os.path.realpath(script))
        return runpy.run_path(script, run_name="__main__")


def _run_dir(argv: list[str]) -> tuple[Path | None, RunConfig]:
    """The run dir and its config: the one ``ptdash`` made, or a new one (rank 0 under a
    plain ``torchrun -m ptdash.bootstrap``); None for other ranks of such a launch."""
    from .shared import rundir

    rank = int(os.environ.get("RANK", 0))
    if "PTDASH_RUN_DIR" in os.environ:
        run_dir = Path(os.environ["PTDASH_RUN_DIR"])
    elif rank == 0:
        name = Path(argv[1] if argv[0] == "-m" else argv[0]).stem
        run_dir = rundir.create(Path(rundir.DEFAULT_ROOT), name, argv=argv, cwd=os.getcwd(), python=sys.executable)
        print(f"ptdash: run dir {run_dir}; watch it with: ptdash attach {run_dir}", file=sys.stderr, flush=True)
    else:
        return None, RunConfig()
    if rank == 0:
        _setup_logging(run_dir)
    return run_dir, rundir.read_info(run_dir).config


def main() -> int:
    from .checkpoint import ResumeError
    from .controls import StopTraining
    from .engine import Engine
    from .shared import rundir

    argv = sys.argv[1:]
    if not argv:
        print("usage: python -m ptdash.bootstrap [-m MODULE | SCRIPT] [ARGS...]", file=sys.stderr)
        return 2
    run_dir, config = _run_dir(argv)
    try:
        engine = Engine(run_dir, config)
        engine.start()
    except Exception as exc:
        print(f"ptdash: {exc}", file=sys.stderr)
        if run_dir is not None and int(os.environ.get("RANK", 0)) == 0:
            rundir.update_info(run_dir, status="crashed", exit_code=1, error=str(exc))
        return 1
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
    except KeyboardInterrupt:
        traceback.print_exc()
        state, code, detail = "stopped", 130, "interrupted"
    except BaseException as exc:
        detail = script_traceback(exc)
        sys.stderr.write(detail)
        state, code = "crashed", 1
        engine.on_crash(exc)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    engine.finish(state, code, detail)
    del script_globals
    return code


if __name__ == "__main__":
    sys.exit(main())
