"""The run's journal: its state, its events and the answers to commands.

Everything worth telling goes through here: ``event`` publishes an Event to every
dashboard at once and keeps it for the store (the flusher drains it); ``ack`` answers a
command and journals it; ``set_state`` moves the run through its states and writes
run.json. The command journal (every command applied or refused, in order) is also kept
in memory, so a checkpoint saved right after an acknowledgement holds it even before
the flusher has stored it.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Callable

from .controls import Settings
from .shared import events, rundir
from .shared.limits import show
from .shared.numbers import json_safe
from .shared.protocol import COMMANDS, ENDED, Ack, Command, Event, Message, Status
from .shared.wire import to_dict

log = logging.getLogger("ptdash.journal")


class Journal:
    """State, events and acknowledgements of one process's engine.

    ``publish(msg)`` sends to every dashboard (a no-op on ranks other than 0);
    ``step()`` is the current step; ``run_dir`` is set where run.json is written (rank 0);
    ``wake()`` asks the flusher to flush soon (a state change should reach the store fast).
    """

    def __init__(self, publish: Callable[[Message], None], step: Callable[[], int], settings: Settings,
                 rank: int = 0, run_dir: Path | None = None, wake: Callable[[], None] = lambda: None) -> None:
        self._publish = publish
        self._step = step
        self._settings = settings
        self._run_dir = run_dir
        self._wake = wake
        self.rank = rank
        self.state = "starting"
        self.paused_at: int | None = None
        self.total_steps: int | None = None
        self.exit_code: int | None = None
        self.detail = ""
        self._lock = threading.Lock()
        self._pending: list[Event] = []
        self._commands: list[dict] = []
        self._mirrored_step: int | None = None
        self.leader_ended: str | None = None
        """How rank 0 ended, when it runs in another process than the hub."""
        self.lr_fixed = False
        """Whether the script turned out to have no torch.optim optimizer (an LR factor cannot act)."""

    def status(self) -> Status:
        s = self._settings
        return Status(state=self.state, step=self.step(), total_steps=self.total_steps, paused_at=self.paused_at,
                      clip=s.clip, lr_scale=s.lr_scale, exit_code=self.exit_code, detail=self.detail,
                      lr_fixed=self.lr_fixed)

    def step(self) -> int:
        """The run's step: this process's, or rank 0's when it runs in another process."""
        own = self._step()
        return own if self._mirrored_step is None else max(own, self._mirrored_step)

    def mirror(self, status: Status) -> None:
        """The hub, when rank 0 runs in another process: rank 0's status is the run's.

        Its end is only remembered: the run ends when the process ptdash started does.
        """
        s = self._settings
        before = (self.state, self.paused_at, s.clip, s.lr_scale, self.total_steps)
        self._mirrored_step = status.step
        s.clip, s.lr_scale, self.lr_fixed = status.clip, status.lr_scale, status.lr_fixed
        if status.total_steps is not None:
            self.total_steps = status.total_steps
        state = self.state
        if status.state in ENDED:
            self.leader_ended = status.state
        else:
            state, self.paused_at = status.state, status.paused_at
        if (state, self.paused_at, s.clip, s.lr_scale, self.total_steps) != before:
            self.set_state(state)  # and run.json
        else:
            self._publish(self.status())  # the periodic status: no need to write run.json

    def set_state(self, state: str | None = None, **changes) -> None:
        """Change the run state (None: only a setting or ``paused_at`` changed), tell every
        dashboard and write run.json."""
        if state is not None:
            self.state = state
            self._wake()
            if state == "finished" and self.step() > 0:
                # Its total was a guess (a schedule's end, --steps); the script's own end is known now.
                self.total_steps = self.step()
        for name in ("paused_at", "total_steps", "exit_code", "detail"):
            if name in changes:
                setattr(self, name, changes.pop(name))
        if changes:
            raise TypeError(f"unknown status fields {sorted(changes)}")
        status = self.status()
        self._publish(status)
        if self._run_dir is not None:
            try:
                rundir.update_info(self._run_dir, status=status.state, step=status.step, paused_at=status.paused_at,
                                   total_steps=status.total_steps, clip=status.clip, lr_scale=status.lr_scale)
            except (OSError, ValueError):
                log.exception("could not update run.json")

    def event(self, what: events.EventData | str, message: str, step: int | None = None) -> Event:
        """Journal an event (stored at the next flush) and publish it now: ``what`` is its
        data (events.py), or the kind of an event that says only its message; at ``step``, or
        the step in progress (a printed metric's is the step it was printed at).

        The data is made JSON-safe here, once: a non-finite number becomes null and the
        event says so with ``"nonfinite": true``, so it can always be stored and sent.
        """
        kind, data = (what, {}) if isinstance(what, str) else events.encode(what)
        safe, replaced = json_safe(data)
        if replaced:
            safe["nonfinite"] = True
        ev = Event(kind=kind, step=self.step() if step is None else step, wall=time.time(), message=str(message), data=safe, rank=self.rank)
        with self._lock:
            self._pending.append(ev)
            if kind == "command":
                self._commands.append(to_dict(ev))
        self._publish(ev)
        return ev

    def ack(self, cmd: Command, ok: bool, step: int | None, message: str) -> None:
        """Answer ``cmd`` (applied at ``step``, or refused) and journal the answer (rank 0
        answers): every answer, a refusal too, so the journal explains every command."""
        if self.rank != 0:
            return
        self._publish(Ack(id=cmd.id, name=cmd.name, ok=ok, step=step, message=message))
        name = cmd.name if cmd.name in COMMANDS else show(cmd.name, 32)
        text = f"{name}: {message}" if ok else f"{name} refused: {message}"
        value = cmd.value if type(cmd.value) in (int, float) else None
        self.event(events.CommandAnswer(id=cmd.id, name=cmd.name, value=value, ok=ok, applied_step=step), text)

    def drain(self) -> list[Event]:
        """The events journaled since the previous drain (for the store)."""
        with self._lock:
            events, self._pending = self._pending, []
        return events

    def commands(self) -> list[dict]:
        """Every command event so far, oldest first, as the protocol's dicts (for checkpoints)."""
        with self._lock:
            return list(self._commands)
