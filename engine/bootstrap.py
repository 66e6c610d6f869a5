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


def _setup_logging(run_dir: Path) -> None:
    handler = logging.FileHandler(run_dir / "engine.log")
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


def main() -> int:
    from . import rundir
    from .controls import StopTraining
    from .engine import Engine

    argv = sys.argv[1:]
    if not argv:
        print("usage: python -m ptdash.bootstrap [-m MODULE | SCRIPT] [ARGS...]", file=sys.stderr)
        return 2
    run_dir = Path(os.environ["PTDASH_RUN_DIR"])
    _setup_logging(run_dir)
    info = rundir.read_info(run_dir)
    try:
        engine = Engine(run_dir, info.get("config", {}))
        engine.start()
    except Exception as exc:
        print(f"ptdash: {exc}", file=sys.stderr)
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
