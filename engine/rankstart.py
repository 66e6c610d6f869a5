"""An engine for a rank that ptdash did not start itself, once it joined a process group.

``mp.spawn`` children, and the ranks a framework starts by re-executing the interpreter,
import the start-up hook (``ptdash/startup``), which calls ``start_rank`` when the
script's ``init_process_group`` returns: the rank and world size are then the process
group's. The engine reports to the hub (the process ptdash started) over the rank link,
and is finished when the process exits.
"""

from __future__ import annotations

import atexit
import ctypes
import logging
import os
import signal
import sys
from pathlib import Path

from . import engine as engine_module

log = logging.getLogger("ptdash.rankstart")

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int | None) -> None:
    """SIGKILL this process when its parent dies (Linux), so that a killed launcher leaves
    no rank behind; at once if the parent is already gone."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)


def wrap_init_in_hub() -> None:
    """The hub's own ``init_process_group``: a child forked from the hub (``multiprocessing``'s
    default start method on Linux) runs no start-up hook, but calls this copy."""
    import torch.distributed as dist

    real = getattr(dist, "init_process_group", None)
    if real is None or getattr(real, "__ptdash__", False):
        return
    hub = os.getpid()

    def init_process_group(*args, **kwargs):
        result = real(*args, **kwargs)
        if os.getpid() != hub:
            try:
                start_rank()
            except Exception as exc:  # noqa: BLE001 - training goes on without ptdash
                print(f"ptdash: this rank runs without ptdash: {type(exc).__name__}: {exc}", file=sys.stderr,
                      flush=True)
        return result

    for name in ("__doc__", "__name__", "__qualname__", "__module__"):
        setattr(init_process_group, name, getattr(real, name))
    init_process_group.__wrapped__ = real
    init_process_group.__ptdash__ = True
    dist.init_process_group = init_process_group


def start_rank() -> None:
    """Start this process's engine (once), as a rank reporting to the hub."""
    inherited = engine_module.ENGINE
    if inherited is not None and inherited.pid != os.getpid():
        # Forked from a process with an engine: that copy's threads are not here, and its
        # hooks would record into nothing. This process gets an engine of its own.
        inherited.abandon()
        engine_module.ENGINE = inherited = None
    if inherited is not None or "PTDASH_RUN_DIR" not in os.environ:
        return
    from .distributed import group_rank
    from .enginelog import setup_logging
    from .shared import rundir

    found = group_rank()
    if found is None:
        return
    run_dir = Path(os.environ["PTDASH_RUN_DIR"])
    setup_logging(run_dir)
    parent = os.environ.get("PTDASH_HUB_PID")
    if parent and parent.isdigit() and os.getppid() == int(parent):
        die_with_parent(int(parent))
    engine = engine_module.Engine(run_dir, rundir.read_info(run_dir).config, hub=False)
    engine.start()
    relay = None
    if engine.printed is not None and "PTDASH_NNODES" not in os.environ:
        # Its printed metrics at its own steps (on another node its output goes to the hub's
        # node by the launcher's pipe, noderelay.py, not read here).
        from .output import OutputRelay

        relay = OutputRelay.for_rank(run_dir)
        if relay is not None:
            relay.follow(engine.printed, engine.hooks.state)
    _watch_uncaught(engine)
    log.info("rank %d of %d (pid %d) reports to the hub", *found, os.getpid())
    # At exit: atexit for an interpreter of its own; a multiprocessing child (forked ones
    # leave through os._exit, past atexit) runs its finalizers instead. Whichever comes first.
    atexit.register(_finish, engine, relay)
    from multiprocessing import util

    util.Finalize(engine, _finish, args=(engine, relay), exitpriority=100)


def _watch_uncaught(engine) -> None:
    """Remember an exception that ends the script (a re-executed rank's crash), for its end's record."""
    previous = sys.excepthook

    def excepthook(kind, value, traceback):
        engine.uncaught = value
        previous(kind, value, traceback)

    sys.excepthook = excepthook


def _leaving_with(exc: BaseException | None) -> BaseException | None:
    """The error a multiprocessing child leaves with, seen from its finalizers (they run
    while it propagates): the target's own exception (``multiprocessing.Process``), or
    the one behind ``mp.spawn``'s ``sys.exit(1)`` (its wrapper catches the script's
    exception, queues the traceback for the parent and exits). None for a clean exit."""
    if isinstance(exc, SystemExit):
        if exc.code in (None, 0):
            return None
        return exc.__context__ if isinstance(exc.__context__, Exception) else exc
    return exc if isinstance(exc, Exception) else None


def _finish(engine, relay=None) -> None:
    """The rank's end (once): its output relay closed (its output so far to output.log, its
    metrics to the last flush), then its engine finished as the script ended."""
    from .controls import StopTraining

    if getattr(engine, "_finished_at_exit", False):
        return
    engine._finished_at_exit = True
    uncaught = getattr(engine, "uncaught", None) or _leaving_with(sys.exc_info()[1])
    stopped = engine.journal.state == "stopping" or isinstance(uncaught, StopTraining)
    if relay is not None:
        relay.close()
    try:
        if stopped:
            engine.finish("stopped", 0)
        elif uncaught is not None:
            engine.on_crash(uncaught)
            engine.finish("crashed", 1, f"{type(uncaught).__name__}: {uncaught}")
        else:
            engine.finish("finished", 0)
    except Exception:  # noqa: BLE001 - at exit: the rank's end must not fail on ptdash
        log.exception("finishing the rank's engine failed")
