"""Runs nobody watches: SIGTERM (preemption, ``timeout``, a batch scheduler), a headless
front that died, and a pause that nobody answers all end in a clean stop.

Each asks the engine for a ``stop`` through the command inbox, as the dashboard's ``s``
key does: the step in progress finishes, a checkpoint is saved at the step boundary,
``StopTraining`` is raised into the script (its ``finally`` blocks run) and the run ends
"stopped". Under DDP that command reaches every rank at the same step.

**Grace period.** A stop waits for the end of the step in progress. If no step ends
within ``STOP_GRACE_S`` seconds of a SIGTERM (the script evaluates, loads data, or does
not step at all), the engine stops the script between steps instead: it saves a
checkpoint of the current state and raises ``StopTraining`` where the script is. 20 s
(``PTDASH_STOP_GRACE``) fits inside the usual notice before SIGKILL (Slurm's KillWait and
Kubernetes' grace period are 30 s by default). A second SIGTERM stops at once, without a
checkpoint.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import Callable

from .controls import StopTraining
from .shared.protocol import Command

log = logging.getLogger("ptdash.unattended")

def _grace() -> float:
    try:
        value = float(os.environ.get("PTDASH_STOP_GRACE", "20"))
    except ValueError:
        return 20.0
    return value if 0 < value < 86400 else 20.0


STOP_GRACE_S = _grace()
"""Seconds a SIGTERM waits for a step boundary before the script is stopped between steps
(``PTDASH_STOP_GRACE`` sets it, for a scheduler whose notice is shorter or longer)."""


class EarlySignals:
    """SIGTERM before the engine is up (it imports torch for seconds): remembered, not fatal."""

    def __init__(self) -> None:
        self.terms = 0
        try:
            self._previous = signal.signal(signal.SIGTERM, self._on_term)
        except ValueError:  # not the main thread
            self._previous = None

    def _on_term(self, *_) -> None:
        self.terms += 1
        if self.terms > 1:
            raise SystemExit(128 + signal.SIGTERM)


class Unattended:
    """Turns SIGTERM, a lost front and an unanswered pause into stop commands.

    ``submit(cmd)`` queues a command (Controls.submit); ``event(kind, message)`` journals;
    ``step()`` is the current step; ``in_step()`` whether an optimizer step is running;
    ``paused()`` whether the run is paused; ``save(step, reason)`` saves a checkpoint;
    ``link`` is the headless front's link (or None); ``pause_timeout`` seconds, or None.
    """

    def __init__(self, submit: Callable[[Command], None], event: Callable[..., object], step: Callable[[], int],
                 in_step: Callable[[], bool], paused: Callable[[], bool], save: Callable[[int, str], str],
                 link=None, pause_timeout: float | None = None, early: EarlySignals | None = None) -> None:
        self._submit, self._event, self._step, self._in_step = submit, event, step, in_step
        self._paused, self._save, self.link, self.pause_timeout = paused, save, link, pause_timeout
        self.terms = 0
        self._stop_asked: str | None = None
        self._interrupt = False
        self._closed = threading.Event()
        self._grace: threading.Timer | None = None
        self._main = threading.main_thread().ident
        self._previous = None
        try:
            self._previous = signal.signal(signal.SIGTERM, self._on_term)
        except ValueError:
            pass
        if early is not None and early.terms:
            self._on_term()
        self._thread = None
        if link is not None or pause_timeout:
            self._thread = threading.Thread(target=self._watch, name="ptdash-unattended", daemon=True)
            self._thread.start()

    # ---------------------------------------------------------------- stops

    def stop(self, why: str, cid: str) -> bool:
        """Ask for a clean stop (once); whether this call asked."""
        if self._stop_asked is not None or self._closed.is_set():
            return False
        self._stop_asked = cid
        self._event("run", f"{why}: stopping cleanly at the next step boundary, with a checkpoint")
        self._submit(Command(id=cid, name="stop"))
        return True

    def _on_term(self, *_) -> None:
        """SIGTERM (main thread): a clean stop, then a stop between steps after the grace period."""
        if self._closed.is_set():
            return
        if self._interrupt:  # the grace period is over: stop here, between steps
            self._interrupt = False
            step = self._step()
            try:
                self._save(step, "stop")
            except Exception as exc:  # noqa: BLE001 - the stop must still happen
                self._event("warning", f"the checkpoint before stopping failed: {exc}")
            raise StopTraining()
        self.terms += 1
        if self.terms > 1:
            self._event("run", "a second SIGTERM: stopping now, without waiting for the step")
            raise StopTraining()
        if self.stop("SIGTERM", "sigterm"):
            at = self._step()
            self._grace = threading.Timer(STOP_GRACE_S, self._grace_over, args=(at,))
            self._grace.daemon = True
            self._grace.start()

    def _grace_over(self, at: int) -> None:
        """No step ended within the grace period: interrupt the script between steps."""
        if self._closed.is_set() or self._step() != at or self._in_step():
            return  # a step ended (the stop is under way), or one is mid-update: it will see the stop
        if self._paused():
            return  # the pause loop applies the stop itself
        self._event("run", f"no step ended within {STOP_GRACE_S:g} s of SIGTERM: stopping between steps")
        self._interrupt = True
        try:
            signal.pthread_kill(self._main, signal.SIGTERM)
        except (OSError, ValueError):
            pass

    # ---------------------------------------------------------------- watch

    def _watch(self) -> None:
        """The front's death and the pause timeout, checked about once a second."""
        paused_since: float | None = None
        link = self.link
        while not self._closed.is_set():
            if link is not None:
                word = link.watch(1.0)
                if word == "lost":
                    link = None
                    if not self._closed.is_set():
                        self.stop("the headless front went away without detaching", "front-lost")
                elif word == "detached":
                    link = None
                    self._event("run", "the headless front detached: the run goes on by itself")
            else:
                self._closed.wait(1.0)
            if self.pause_timeout:
                if self._paused():
                    paused_since = paused_since or time.monotonic()
                    if time.monotonic() - paused_since >= self.pause_timeout:
                        self.stop(f"paused for {self.pause_timeout:g} s and nobody resumed it (--pause-timeout)",
                                  "pause-timeout")
                else:
                    paused_since = None

    def close(self) -> None:
        """The script has ended: signals no longer stop anything (the engine is finishing)."""
        self._closed.set()
        if self._grace is not None:
            self._grace.cancel()
        try:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        except ValueError:
            pass


def attach(engine, link, early: EarlySignals | None) -> Unattended:
    """Wire the stops to an engine that has started (the bootstrap calls this)."""
    from .shared import diskspace

    diskspace.NOTICE.sinks = [lambda message: engine.journal.event("disk", message)]
    if link is not None:
        diskspace.NOTICE.sinks.append(link.notice)
    hooks, controls = engine.hooks, engine.controls
    return Unattended(controls.submit, engine.journal.event, lambda: hooks.step, lambda: hooks._in_step,
                      lambda: controls.paused, engine.checkpointer.save, link=link,
                      pause_timeout=engine.config.pause_timeout if engine.primary else None, early=early)


def finish(engine, run_dir, state: str, code: int, detail: str) -> None:
    """``engine.finish`` that cannot fail: whatever goes wrong in it (a full disk), run.json
    still ends in a final state; the exit status stays the script's (the caller's)."""
    try:
        engine.finish(state, code, detail)
        return
    except BaseException:  # noqa: BLE001 - the run must still end in a final state
        log.exception("finishing the run failed; recording its end in run.json")
    if run_dir is None or not engine.primary:
        return
    from .shared import rundir

    try:
        rundir.update_info(run_dir, status=state, exit_code=code, ended=time.time(), step=engine.hooks.step,
                           detail=detail.strip().splitlines()[-1] if detail.strip() else None)
    except Exception:  # noqa: BLE001
        log.exception("could not record the run's end in run.json")
    try:
        rundir.unregister(engine.info.id)
    except OSError:
        pass
