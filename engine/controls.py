"""Live controls: the command inbox and its application at step boundaries.

Commands arrive on the server thread; they are validated there (a bad one is refused at
once) and queued. The training thread applies them at the next optimizer step boundary
and acknowledges each with the step. Pausing blocks the training thread in the step
pre-hook, before the update is applied, while the other threads keep serving the
dashboard; commands sent while paused (checkpoint, clip, LR, stop) are applied from the
pause loop.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass, field
from typing import Callable

from .shared.limits import check_setting, validate_command
from .shared.protocol import Command

NO_OPTIMIZER = "the script sets its own LR (no torch.optim optimizer); ptdash cannot scale it"
"""Why an LR factor cannot act on a script that updates its parameters itself: its LR is a
variable of its own, and scaling the gradients instead is exactly right only for plain SGD
(not with momentum, weight decay or an update rule of its own, which ptdash cannot see)."""


class StopTraining(SystemExit):
    """Raised into the script to end it cleanly: ``finally`` blocks and atexit handlers run.

    A SystemExit, so the script's ``except Exception`` does not swallow it.
    """

    def __init__(self) -> None:
        super().__init__(0)


@dataclass
class Settings:
    """The values commands change; saved in checkpoints and restored on resume."""

    clip: float | None = None
    """Gradient-clipping override; None leaves the script's own clipping alone."""
    lr_scale: float = 1.0
    """Factor on every param group's LR, on top of the schedulers."""

    def __post_init__(self) -> None:
        error = (self.clip is not None and check_setting("clip", self.clip)) or check_setting("lr_scale", self.lr_scale)
        if error:
            raise ValueError(error)


@dataclass
class Pending:
    """Work that waits for the next save point (the start of the next step)."""

    checkpoint: list[str] = field(default_factory=list)
    """Ids of checkpoint commands waiting (several requests share one save)."""
    stop: str | None = None
    reason: str = ""


class Controls:
    """Owns the inbox and the live settings; the parts it steers are handed to it.

    ``journal`` answers and journals (``ack``, ``set_state``); ``save(step, reason)``
    saves a checkpoint and returns its summary; ``profile(cmd, step)`` opens a profile
    window; ``kill()`` ends the run at once; ``step_seconds()`` is the recent step time
    (to space the rank exchanges); ``dist`` is the multi-rank channel, or None alone.
    """

    def __init__(self, settings: Settings, journal, save: Callable[[int, str], str],
                 profile: Callable[[Command, int], None], kill: Callable[[], None],
                 step_seconds: Callable[[], float], dist=None) -> None:
        self.settings = settings
        self.dist = dist
        """The multi-rank channel (distributed.Distributed) or None when alone."""
        self.paused = False
        self.pending = Pending()
        self._journal, self._save, self._profile, self._kill = journal, save, profile, kill
        self._step_seconds = step_seconds
        self._inbox: collections.deque[Command] = collections.deque()
        self._wake = threading.Event()
        self.requested_pause = False
        self.refuse_partial: Callable[[], str | None] = lambda: None
        """Why clip and LR changes cannot reach every replica now (some rank runs without ptdash)."""
        self.on_stacks: Callable[[str], None] = lambda cmd_id: None
        """Takes every rank's stacks and answers the command with them (stackgather.py)."""
        self.on_queued: Callable[[], None] = lambda: None
        """Called after a command is queued (the hub ends a paused round's wait)."""
        self.lr_refusal: Callable[[], str | None] = lambda: None
        """Why an LR factor cannot act now (the script has no torch.optim optimizer), at a boundary."""
        self.lr_origin = "--lr-scale"
        """Where a factor in force at the start came from (the option, or a resumed checkpoint)."""
        self.rollback = None
        """The rollback part (rollback.py), when the run keeps snapshots."""

    # -------------------------------------------------------------- server thread

    def submit(self, cmd: Command) -> None:
        """Validate and queue a command; refuse it at once when invalid."""
        error = validate_command(cmd)
        if not error and cmd.name in ("clip", "lr_scale"):
            error = self.refuse_partial()
        if error:
            self._journal.ack(cmd, False, None, error)
            return
        if cmd.name == "kill":
            self._kill()
            return
        if cmd.name == "stacks":
            self.on_stacks(cmd.id)  # answered at once, by the engine's own threads
            return
        if cmd.name == "pause":
            self.requested_pause = True
        self._inbox.append(cmd)
        self._wake.set()
        self.on_queued()

    def take(self, n: int) -> list[Command]:
        """Pop up to ``n`` queued commands (the hub hands them to every rank at once)."""
        out = []
        while self._inbox and len(out) < n:
            out.append(self._inbox.popleft())
        return out

    def queued(self) -> int:
        return len(self._inbox)

    # ------------------------------------------------------------ training thread

    def has_work(self, step: int) -> bool:
        """Cheap check for the hot path: anything queued, pending, or a rank exchange due?"""
        pending = self.pending
        return bool(self._inbox or self.paused or pending.checkpoint or pending.stop is not None
                    or (self.dist is not None and self.dist.due(step))
                    or (self.rollback is not None and self.rollback.due))

    def at_step_start(self, step: int) -> None:
        """Apply queued commands before step ``step + 1`` updates; block while paused."""
        self._apply_inbox(step)
        if self.rollback is not None and self.rollback.due:
            self.rollback.at_boundary(step)
        while self.paused:
            if self.dist is None or not self.dist.ready:
                self._wake.wait(0.5)
                self._wake.clear()
            # Under DDP the hub holds this exchange open until a command comes or half a
            # second passes: a resume is immediate, and the ranks go round twice a second.
            self._apply_inbox(step, force=True, paused=True)
            if self.pending.checkpoint or self.pending.stop is not None:
                # Paused runs still save and stop when asked.
                self.at_save_point(step)

    def pause_here(self, step: int, message: str) -> None:
        """Pause now, on the training thread (an anomaly), until a resume or stop arrives."""
        self.paused = True
        self._journal.set_state("paused", paused_at=step)
        self.at_step_start(step)

    def at_save_point(self, step: int) -> None:
        """Serve pending checkpoints and stops. Raises StopTraining to end the script."""
        pending = self.pending
        if pending.checkpoint:
            ids, pending.checkpoint = pending.checkpoint, []
            try:
                summary = self._save(step, pending.reason or "requested")
            except Exception as exc:  # a failed save must not kill training
                for cid in ids:
                    self._journal.ack(Command(cid, "checkpoint"), False, step, f"checkpoint failed: {exc}")
            else:
                for cid in ids:
                    if cid:
                        self._journal.ack(Command(cid, "checkpoint"), True, step, summary)
            pending.reason = ""
        if pending.stop is not None:
            cid, pending.stop = pending.stop, None
            try:
                summary = self._save(step, "stop")
            except Exception as exc:
                summary = f"checkpoint failed: {exc}"
            self._journal.ack(Command(cid, "stop"), True, step, f"stopping after step {step}; {summary}")
            self.paused = False
            self._journal.set_state("stopping")
            raise StopTraining()

    def without_optimizer(self) -> None:
        """The script's first step ended with no torch.optim optimizer (training thread): an
        LR factor in force from the start cannot act, so it is said once and set back to 1,
        so that nothing shows a factor that is not applied."""
        scale = self.settings.lr_scale
        self.settings.lr_scale, self._journal.lr_fixed = 1.0, True  # the dashboards dim the l key
        self._journal.set_state(None)
        if scale != 1.0:
            self._journal.event("warning", f"{self.lr_origin} {scale:g} is not applied: {NO_OPTIMIZER}")

    def request_checkpoint(self, reason: str) -> None:
        """Ask for a checkpoint at the next save point (periodic saves use this)."""
        if "" not in self.pending.checkpoint:
            self.pending.checkpoint.append("")
        self.pending.reason = reason

    def _apply_inbox(self, step: int, force: bool = False, paused: bool = False) -> None:
        if self.dist is not None and self.dist.ready:
            if not (force or self.dist.due(step)):
                return
            # The hub takes the queued commands (its own inbox) and hands every rank the same.
            rollback = self.rollback
            local = self.dist.exchange(step, self._step_seconds(), hold=paused,
                                       vote=rollback.vote(step) if rollback is not None else None)
            if rollback is not None and self.dist.verdict is not None:
                rollback.agreed(self.dist.verdict, step)
        else:
            local = self.take(len(self._inbox))
        for cmd in local:
            self._apply(cmd, step)

    def _apply(self, cmd: Command, step: int) -> None:
        fx, s = self._journal, self.settings
        if cmd.name == "pause":
            self.requested_pause = False
            if self.paused:
                fx.ack(cmd, False, step, "already paused")
                return
            self.paused = True
            fx.set_state("paused", paused_at=step)
            fx.ack(cmd, True, step, f"paused at step {step}")
        elif cmd.name == "resume":
            if not self.paused:
                fx.ack(cmd, False, step, "not paused")
                return
            self.paused = False
            fx.set_state("running", paused_at=None)
            fx.ack(cmd, True, step, f"resumed at step {step}")
        elif cmd.name == "clip":
            old, s.clip = s.clip, cmd.value
            fx.set_state(None)
            fx.ack(cmd, True, step, _clip_change(old, s.clip, step + 1))
        elif cmd.name == "lr_scale":
            refusal = self.lr_refusal()
            if refusal:
                fx.ack(cmd, False, step, refusal)
                return
            old, s.lr_scale = s.lr_scale, float(cmd.value)
            fx.set_state(None)
            fx.ack(cmd, True, step, f"LR factor {old:g} -> {s.lr_scale:g} from step {step + 1}")
        elif cmd.name == "checkpoint":
            self.pending.checkpoint.append(cmd.id)
            if not self.paused:
                self.pending.reason = "requested"
        elif cmd.name == "stop":
            self.pending.stop = cmd.id
            fx.set_state("stopping")
        elif cmd.name == "rollback":
            self._rollback(cmd, step)
        elif cmd.name == "profile":
            self._profile(cmd, step)

    def _rollback(self, cmd: Command, step: int) -> None:
        """The ``rollback`` command: the last good state put back now (rollback.py), and a
        paused run resumed; refused with the reason when there is none."""
        fx = self._journal
        if self.rollback is None:
            fx.ack(cmd, False, step, "this run keeps no snapshot to roll back to (start it with "
                   "--on-anomaly rollback, or --rollback-every K)")
            return
        ok, message = self.rollback.command(step)
        if ok and self.paused:
            self.paused = False
            fx.set_state("running", paused_at=None)
            message += f"; resumed at step {step}"
        fx.ack(cmd, ok, step, message)


def _clip_change(old: float | None, new: float | None, step: int) -> str:
    """What a clip command did, None being no live clip (whatever the script itself clips at):
    "clip norm 0.5 from step 121 (was the script's own clipping)"."""
    if old is None:
        return f"clip norm {new:g} from step {step} (was the script's own clipping)" if new is not None else \
            "clip norm unchanged: the script's own clipping"
    if new is None:
        return f"clip norm {old:g} -> the script's own clipping from step {step}"
    return f"clip norm {old:g} -> {new:g} from step {step}"
