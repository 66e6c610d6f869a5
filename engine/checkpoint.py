"""Checkpoints with no code change: the ``Checkpointer`` that saves the script's objects at
a step boundary (atomically, with room made on the disk), and resumes from one at the first
forward pass. The format, and loading one back, are checkpoint_format.py's; the files on
disk, checkpoint_files.py's; a sharded model's, checkpoint_dcp.py's.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from . import checkpoint_dcp
from .checkpoint_files import SPACE_MARGIN, needed_bytes, prune, save_atomic, sweep_runs, sweep_temp_files  # noqa: F401
from .checkpoint_format import (
    FORMAT_VERSION,
    CheckpointError,
    ResumeError,
    apply,
    build,
    load,
    rng_state,
    set_rng_state,
)
from .discovery import Discovery
from .invisible import own
from .sharded import is_sharded
from .shared import diskspace, events, perms


class Checkpointer:
    """Saves the script's objects (found by ``discovery``) with ptdash's live settings and
    command journal; loads a checkpoint back at the first forward of a resumed run.

    Under DDP every rank calls ``save`` at the same step; rank 0 writes, between two
    barriers of the rank channel, so a checkpoint counts as complete only once every rank
    has reached the barrier after the write.
    """

    def __init__(self, run_dir: Path | None, run_id: str, discovery: Discovery, journal, settings, config,
                 barrier=lambda: None, leads: bool = True) -> None:
        self.run_dir, self.run_id = (run_dir if leads else None), run_id
        self._shared_dir = run_dir
        """The run dir on every rank: each writes its shards of a sharded model there (checkpoint_dcp.py)."""
        self._discovery, self._journal, self._settings, self._config = discovery, journal, settings, config
        self._barrier = barrier
        self.last_save = time.monotonic()
        self._resume: dict | None = None
        self.start_step = 0
        """The step a resumed run continues from (0 when not resuming)."""
        self.asked = False
        """Whether the script asked for ``ptdash.start_step()`` (it then continues exactly)."""
        self.swept = sweep_runs(run_dir) if run_dir is not None and leads else []
        """Temp files of killed saves removed at the start."""

    def save(self, step: int, reason: str) -> str:
        """Save now (training thread, every rank); return a one-line summary (rank 0's)."""
        self._barrier()
        try:
            models = self._discovery.ensure_models() if self._shared_dir is not None else []
            if any(is_sharded(list(m.parameters())) for m in models):
                return self._write_sharded(step, reason, models)
            return self._write(step, reason) if self.run_dir is not None else ""
        finally:
            self.last_save = time.monotonic()
            self._barrier()

    def _write(self, step: int, reason: str) -> str:
        t0 = time.perf_counter()
        d = self._discovery
        models = d.ensure_models()
        obj = build(step, models, d.live(d.optimizers), d.top_schedulers(), d.live(d.scalers), self._meta(reason))
        path = self.run_dir / "checkpoints" / f"step-{step}.pt"
        perms.make_dir(path.parent)
        sweep_temp_files(path.parent)
        self._make_room(path.parent, needed_bytes(obj))
        try:
            size = save_atomic(obj, path)
        except Exception as exc:
            needed = needed_bytes(obj)
            free = diskspace.free_bytes(path.parent)
            if diskspace.is_full(exc) or (free is not None and free < needed):
                raise CheckpointError(self._no_space(free, needed)) from None
            raise
        seconds = time.perf_counter() - t0
        if self._config.keep_last:
            prune(path.parent, self._config.keep_last)
        diskspace.NOTICE.room_again()
        summary = f"saved {path} ({size / 1e6:.1f} MB in {seconds:.2f} s)"
        self._journal.event(events.Checkpoint(path=str(path), bytes=size, seconds=seconds, reason=reason), summary)
        return summary

    def _meta(self, reason: str) -> dict:
        return {"run_id": self.run_id, "reason": reason,
                "controls": {"clip": self._settings.clip, "lr_scale": self._settings.lr_scale},
                "journal": [e for e in self._journal.commands()]}

    def _write_sharded(self, step: int, reason: str, models: list) -> str:
        """Every rank writes its shards (checkpoint_dcp.py); rank 0 names the result."""
        t0 = time.perf_counter()
        d = self._discovery
        path, size = checkpoint_dcp.save(self._shared_dir / "checkpoints", step, models, d.live(d.optimizers),
                                         d.top_schedulers(), d.live(d.scalers),
                                         {"version": FORMAT_VERSION, **self._meta(reason)}, rng_state(), self._barrier)
        if self.run_dir is None:
            return ""
        seconds = time.perf_counter() - t0
        if self._config.keep_last:
            prune(path.parent, self._config.keep_last)
        summary = f"saved {path} ({size / 1e6:.1f} MB of shards from every rank in {seconds:.2f} s)"
        self._journal.event(events.Checkpoint(path=str(path), bytes=size, seconds=seconds, reason=reason), summary)
        return summary

    def _make_room(self, directory: Path, needed: int) -> None:
        """Before a save: is there room for it? ``--keep-last`` pruning is tried first (down
        to one fewer, the new one makes up the count); a save that cannot fit is not started,
        so it never fills the disk that the script's output and the store also need."""
        # What is free less the store's headroom: a checkpoint never takes the room the
        # history needs (its WAL, its next rows), whatever else fills the disk.
        free = diskspace.checkpoint_room(directory)
        if free is None or free >= needed:
            return
        keep = self._config.keep_last
        if keep:
            # With --keep-last 1 the one kept goes only once the new one is safely written.
            removed = prune(directory, keep - 1) if keep > 1 else []
            if removed:
                self._journal.event(events.Checkpoint(removed=tuple(map(str, removed))),
                                    f"removed {len(removed)} older checkpoint(s) before saving, "
                                    f"to make room (--keep-last {keep})")
            free = diskspace.checkpoint_room(directory)
            if free is None or free >= needed:
                return
        raise CheckpointError(self._no_space(diskspace.free_bytes(directory), needed, kept=True))

    def _no_space(self, free: int | None, needed: int, kept: bool = False) -> str:
        """The one plain line about a full disk (said once as a notice, then short)."""
        what = f"checkpoint needs {diskspace.fmt_bytes(needed)}" + (
            f" and {diskspace.fmt_bytes(diskspace.STORE_HEADROOM_BYTES)} is kept free for the history" if kept else "")
        if diskspace.NOTICE.full(self.run_dir, what):
            return f"no space left on the run dir's filesystem: {diskspace.fmt_bytes(free)} free, {what}"
        return f"not saved: the run dir's filesystem is still full ({diskspace.fmt_bytes(free)} free, {what})"

    def due(self, step: int) -> bool:
        """Whether ``--checkpoint-every`` asks for a save after step ``step``."""
        every, every_s = self._config.checkpoint_every, self._config.checkpoint_every_s
        return bool((every and step % every == 0)
                    or (every_s and time.monotonic() - self.last_save >= every_s))

    # ------------------------------------------------------------------ resume

    def load_resume(self) -> dict | None:
        """Read ``--resume``'s checkpoint (before the script runs); its saved controls, or None."""
        if not self._config.resume:
            return None
        path = Path(self._config.resume)
        self._resume = ({**checkpoint_dcp.read_meta(path), "sharded": path}
                        if checkpoint_dcp.is_sharded_checkpoint(path) else load(path))
        self.start_step = int(self._resume["ptdash"]["step"])
        return self._resume["ptdash"].get("controls", {})

    @property
    def resuming(self) -> bool:
        return self._resume is not None

    def apply_resume(self) -> None:
        """Load the checkpoint into the script's objects (at its first forward or step).

        Raises ResumeError when it does not fit them, ending the run before its first step.
        """
        ckpt, self._resume = self._resume, None
        d = self._discovery
        try:
            if "sharded" in ckpt:
                restored, warnings, rng = checkpoint_dcp.load(ckpt["sharded"], d.ensure_models(),
                                                              d.live(d.optimizers), d.top_schedulers(), d.live(d.scalers))
                set_rng_state(rng)
            else:
                restored, warnings = apply(ckpt, d.ensure_models(), d.live(d.optimizers), d.top_schedulers(),
                                           d.live(d.scalers))
        except CheckpointError as exc:
            raise ResumeError(f"cannot resume from {self._config.resume}: {exc}") from None
        except Exception as exc:  # DCP's many kinds, for shards that do not fit: one line
            first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
            raise ResumeError(f"cannot resume from {self._config.resume}: {first}") from None
        self._journal.event(events.RunNote(restored=tuple(restored), warnings=tuple(warnings)),
                            f"resumed from {self._config.resume} at step {self.start_step}: restored "
                            f"{', '.join(restored) or 'nothing'}; not restored: where the script's data loop was "
                            "(it continues exactly only if it starts at ptdash.start_step())"
                            + (f"; {'; '.join(warnings)}" if warnings else ""))

    def after_first_step(self) -> None:
        """After a resumed run's first step: say so if the script runs its whole loop again."""
        if self.start_step and not self.asked:
            self._journal.event("warning", f"the script does not start its loop at ptdash.start_step(): after "
                                f"resuming at step {self.start_step} it runs its whole loop again, from its first "
                                "batch; a scheduler restored near its end stops the run cleanly when it runs out")

    def guard_schedulers(self, patches, step) -> None:
        """A resumed run: a restored scheduler that reaches its end stops the run cleanly.

        The script's loop runs its full length again after a resume unless it starts at
        ``ptdash.start_step()``, so a OneCycleLR restored at step N would raise "Tried to
        step ... times" N steps before the loop ends.
        """
        original = torch.optim.lr_scheduler.LRScheduler.step
        checkpointer = self

        @own
        def step_scheduler(sched, *args, **kwargs):
            total = getattr(sched, "total_steps", None)
            if isinstance(total, int) and not isinstance(total, bool) and sched.last_epoch + 1 > total:
                checkpointer._scheduler_end(sched, total, step())
            return original(sched, *args, **kwargs)

        step_scheduler.__wrapped__ = original
        patches.set(torch.optim.lr_scheduler.LRScheduler, "step", step_scheduler)

    def _scheduler_end(self, sched, total: int, step: int) -> None:
        from .controls import StopTraining

        self._journal.event(events.RunNote(step=step, total=total),
                            f"the restored {type(sched).__name__} reached its end ({total} steps) at step "
                            f"{step}: stopping cleanly instead of letting it raise")
        try:
            self.save(step, "scheduler end")
        finally:
            raise StopTraining()


class FirstForward:
    """Calls ``apply()`` once: at the first module forward, or when called first.

    The first forward is the latest moment at which loading weights still changes the
    first step's gradients; a global forward hook costs microseconds per module call, so
    it removes itself as soon as it has fired.
    """

    def __init__(self, apply) -> None:
        self._apply = apply
        self._handle = torch.nn.modules.module.register_module_forward_pre_hook(self)

    @own
    def __call__(self, *_) -> None:
        apply, self._apply = self._apply, None
        self.remove()
        if apply is not None:
            apply()

    def remove(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
