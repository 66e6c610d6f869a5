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

Not covered: a SIGTERM sent to every process of the job when the script has DataLoader
workers. torch's workers die on a SIGTERM from anyone but their parent, and the training
process then raises "DataLoader worker ... is killed by signal" mid-step, before the
stop is served (as it does under plain python). Keeping the workers alive would take
the sender's pid, which a Python signal handler does not see.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import threading
import time
from typing import Callable

from .controls import StopTraining
from .shared.exits import STOP_GRACE_S
from .shared.protocol import Command

log = logging.getLogger("ptdash.unattended")


def multi_rank() -> bool:
    """Whether this process is one rank of several started by a launcher (torchrun)."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1")) > 1
    except ValueError:
        return False


class EarlySignals:
    """SIGTERM before the engine is up (it imports torch for seconds): remembered, not fatal."""

    def __init__(self) -> None:
        self.terms = 0
        self._previous = None
        if multi_rank():
            return  # a launcher's SIGTERM to its ranks keeps its meaning there (see Unattended)
        try:
            self._previous = signal.signal(signal.SIGTERM, self._on_term)
        except ValueError:  # not the main thread
            pass

    def _on_term(self, *_) -> None:
        self.terms += 1
        if self.terms > 1:
            raise SystemExit(128 + signal.SIGTERM)


class Unattended:
    """Turns SIGTERM, a lost front and an unanswered pause into stop commands.

    ``submit(cmd)`` queues a command (Controls.submit); ``event(kind, message)`` journals a note;
    ``step()`` is the current step; ``in_step()`` whether an optimizer step is running;
    ``paused()`` whether the run is paused; ``save(step, reason)`` saves a checkpoint;
    ``link`` is the headless front's link (or None); ``pause_timeout`` seconds, or None;
    ``signals``: whether SIGTERM is handled here (not under DDP, where the launcher sends
    SIGTERM to stop the ranks that survive a failed one, and a stop that needs every rank
    could not finish).

    The signal handler runs on the training thread wherever it is, possibly inside a lock
    of ptdash's own: it only writes a byte to a pipe (or raises StopTraining); the watch
    thread does the journaling and the asking.
    """

    def __init__(self, submit: Callable[[Command], None], event: Callable[..., object], step: Callable[[], int],
                 in_step: Callable[[], bool], paused: Callable[[], bool], save: Callable[[int, str], str],
                 link=None, pause_timeout: float | None = None, early: EarlySignals | None = None,
                 signals: bool = True) -> None:
        self._submit, self._event, self._step, self._in_step = submit, event, step, in_step
        self._paused, self._save, self.link, self.pause_timeout = paused, save, link, pause_timeout
        self.terms = 0
        self.save_at_end = False
        """Whether the script was stopped between steps: its checkpoint is saved once it has unwound."""
        self._stop_asked: str | None = None
        self._interrupt = False
        self._closed = threading.Event()
        self._grace: threading.Timer | None = None
        self._main = threading.main_thread().ident
        self._pid = os.getpid()
        self._kick_r, self._kick_w = os.pipe()
        os.set_blocking(self._kick_w, False)
        self.signals = signals
        if signals:
            try:
                signal.signal(signal.SIGTERM, self._on_term)
            except ValueError:
                self.signals = False
        if self.signals and early is not None and early.terms:
            self._on_term()
        self._thread = None
        if link is not None or pause_timeout or self.signals:
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
        """SIGTERM (training thread): ask the watch thread for a clean stop; after the grace
        period, or on a second SIGTERM, stop the script where it is."""
        if os.getpid() != self._pid:
            self._in_forked_child()
            return
        if self._closed.is_set():
            return
        if self._interrupt:  # the grace period is over
            self._interrupt = False
            if self._in_step():
                return  # a step began after all: its boundary takes the stop
            self.save_at_end = True
            raise StopTraining()
        self.terms += 1
        self._kick(b"1" if self.terms == 1 else b"2")
        if self.terms > 1:
            raise StopTraining()

    def _in_forked_child(self) -> None:
        """SIGTERM in a process the script forked (``multiprocessing`` with fork): what it
        would be without ptdash (``Pool.terminate`` relies on it)."""
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    def _kick(self, byte: bytes) -> None:
        try:
            os.write(self._kick_w, byte)
        except OSError:
            pass

    def _on_kick(self, data: bytes) -> None:
        """What the signal handler asked for (watch thread)."""
        if b"1" in data and self.stop("SIGTERM", "sigterm"):
            self._grace = threading.Timer(STOP_GRACE_S, self._grace_over, args=(self._step(),))
            self._grace.daemon = True
            self._grace.start()
        if b"2" in data:
            self._event("run", "a second SIGTERM: stopping now, without waiting for the step")

    def _grace_over(self, at: int) -> None:
        """No step ended within the grace period: interrupt the script between steps."""
        if self._closed.is_set() or self._step() != at or self._in_step() or self._paused():
            return  # a step ended (the stop is under way), one is mid-update, or the pause loop has it
        self._event("run", f"no step ended within {STOP_GRACE_S:g} s of SIGTERM: stopping between steps")
        self._interrupt = True
        try:
            signal.pthread_kill(self._main, signal.SIGTERM)
        except (OSError, ValueError):
            pass

    def save_if_stopped_between_steps(self) -> None:
        """After the script has unwound: the checkpoint of a stop between steps."""
        if not self.save_at_end:
            return
        self.save_at_end = False
        try:
            self._save(self._step(), "stop")
        except Exception as exc:  # noqa: BLE001 - the run must still finish
            self._event("warning", f"the checkpoint of the stop between steps failed: {exc}")

    # ---------------------------------------------------------------- watch

    def _watch(self) -> None:
        """Signals, the front's death and the pause timeout, checked about once a second."""
        paused_since: float | None = None
        link = self.link
        while not self._closed.is_set():
            waits = [self._kick_r] + ([link.sock] if link is not None else [])
            try:
                ready, _, _ = select.select(waits, [], [], 1.0)
            except (OSError, ValueError):
                return
            if self._kick_r in ready:
                self._on_kick(os.read(self._kick_r, 64))
            if link is not None and link.sock in ready:
                word = link.watch(0)
                if word == "lost":
                    link = None
                    self.stop("the headless front went away without detaching", "front-lost")
                elif word == "detached":
                    link = None
                    self._event("run", "the headless front detached: the run goes on by itself")
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
        if self.signals:
            try:
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
            except ValueError:
                pass
        self._kick(b"0")  # wakes the watch thread to see it is closed


def attach(engine, link, early: EarlySignals | None) -> Unattended:
    """Wire the stops to an engine that has started (the bootstrap calls this)."""
    from .shared import diskspace

    diskspace.NOTICE.sinks = [lambda message: engine.journal.event("disk", message)]
    if link is not None:
        diskspace.NOTICE.sinks.append(link.notice)
    hooks, controls = engine.hooks, engine.controls
    signals = not (engine.dist.multi or multi_rank())
    return Unattended(controls.submit, engine.journal.event, lambda: hooks.step, lambda: hooks.state.in_step,
                      lambda: controls.paused, engine.checkpointer.save, link=link,
                      pause_timeout=engine.config.pause_timeout if engine.primary else None, early=early,
                      signals=signals)


def finish(engine, run_dir, state: str, code: int, detail: str, guard: Unattended | None = None) -> None:
    """``engine.finish`` that cannot fail: whatever goes wrong in it (a full disk), run.json
    still ends in a final state; the exit status stays the script's (the caller's).
    ``guard``'s stop between steps gets its checkpoint first."""
    if guard is not None:
        guard.save_if_stopped_between_steps()
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
