"""The engine: everything ptdash runs inside the training process, wired together.

Threads:
- the training thread runs the script; the hooks record each step and apply commands;
- the flusher (``ptdash-flush``) moves records to the host a few times a second, writes
  them to the store, samples the system and publishes to the dashboard;
- the server (``ptdash-server``, transport.py) accepts dashboards and queues commands.

The training thread never waits for the other two.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import threading
import time
import traceback
from pathlib import Path

import torch

from . import checkpoint, rundir
from .controls import Controls, Settings
from .hooks import Hooks
from .protocol import Ack, Command, Event, Metrics, Status, Welcome, finite_or_none
from .recorder import Recorder
from .store import STORE_NAME, StoreWriter
from .transport import Server

log = logging.getLogger("ptdash.engine")

ENGINE: Engine | None = None
"""The engine of this process, for the public API in ``ptdash/__init__.py``."""


class Engine:
    """One process's instrumentation: hooks, controls, store, server, flusher."""

    def __init__(self, run_dir: Path, config: dict) -> None:
        self.run_dir = Path(run_dir)
        self.info = rundir.read_info(self.run_dir)
        self.config = config
        self.settings = Settings(clip=config.get("clip"), lr_scale=config.get("lr_scale") or 1.0)
        self.controls = Controls(self.settings, self)
        self.recorder = Recorder()
        self.hooks = Hooks(self)
        self.flush_interval = float(config.get("flush_interval", 0.25))
        self.start_step = 0
        self.state = "starting"
        self.paused_at: int | None = None
        self.total_steps: int | None = None
        self.exit_code: int | None = None
        self.detail = ""
        self._events: list[tuple] = []
        self._user_values: dict = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None
        self._resume: dict | None = None
        self._last_checkpoint_time = time.monotonic()
        self.store = StoreWriter(self.run_dir / STORE_NAME)
        self.server = Server(
            Path(self.info["socket"]), rundir.read_token(self.run_dir),
            Welcome(run_id=self.info["id"], run_dir=str(self.run_dir), pid=os.getpid()),
            on_command=self.controls.submit, on_connect=lambda: [self.status()])

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Install hooks, open the socket, start the flusher. Called before the script runs."""
        global ENGINE
        ENGINE = self
        if self.config.get("resume"):
            self._resume = checkpoint.load(Path(self.config["resume"]))
            self.start_step = int(self._resume["ptdash"]["step"])
            saved = self._resume["ptdash"].get("controls", {})
            self.settings.clip = saved.get("clip", self.settings.clip) if self.config.get("clip") is None else self.settings.clip
            self.settings.lr_scale = saved.get("lr_scale", 1.0) if self.config.get("lr_scale") is None else self.settings.lr_scale
        self.hooks.step = self.start_step
        self.hooks.attach()
        if self._resume is not None:
            self.hooks.arm_resume(self._apply_resume)
        self.server.start()
        rundir.register(self.info["id"], self.run_dir)
        rundir.update_info(self.run_dir, status="running", pid=os.getpid(), started=time.time(),
                           torch_version=torch.__version__, start_step=self.start_step)
        self.store.set_meta(config=self.config, run=self.info)
        self.event("run", f"started{' from step %d' % self.start_step if self.start_step else ''}")
        self._flusher = threading.Thread(target=self._flush_loop, name="ptdash-flush", daemon=True)
        self._flusher.start()

    def finish(self, state: str, exit_code: int, detail: str = "") -> None:
        """Record how the script ended, flush everything, close the socket."""
        global ENGINE
        if self.controls.pending.checkpoint and state == "finished":
            try:
                self.controls.at_save_point(self.hooks.step)
            except Exception:
                log.exception("final checkpoint failed")
        self.hooks.detach()
        self.exit_code = exit_code
        self.detail = detail
        self.set_state(state)
        self.event("run", f"{state} with exit code {exit_code}" + (f": {detail.splitlines()[-1]}" if detail else ""))
        self._stop.set()
        if self._flusher is not None:
            self._flusher.join(timeout=10)
        self._flush()
        self.server.stop()
        self.store.close()
        rundir.update_info(self.run_dir, status=state, exit_code=exit_code, ended=time.time(),
                           steps=self.hooks.step)
        rundir.unregister(self.info["id"])
        ENGINE = None

    # -------------------------------------------------------------- state, events

    def status(self) -> Status:
        return Status(state=self.state, step=self.hooks.step, total_steps=self.total_steps,
                      paused_at=self.paused_at, clip=self.settings.clip, lr_scale=self.settings.lr_scale,
                      exit_code=self.exit_code, detail=self.detail)

    def set_state(self, state: str | None, **changes) -> None:
        """Change the run state (None: only settings changed) and tell every dashboard."""
        if state is not None:
            self.state = state
        if "paused_at" in changes:
            self.paused_at = changes["paused_at"]
        self.server.publish(self.status())
        if state is not None:
            try:
                rundir.update_info(self.run_dir, status=state, step=self.hooks.step)
            except OSError:
                log.exception("could not update run.json")

    def event(self, kind: str, message: str, **data) -> None:
        """Journal an event (stored at the next flush) and publish it now."""
        ev = Event(kind=kind, step=self.hooks.step, wall=time.time(), message=message, data=data)
        with self._lock:
            self._events.append((ev.wall, ev.step, ev.kind, ev.message, ev.data))
        self.server.publish(ev)

    # -------------------------------------------------- effects used by Controls

    def ack(self, cmd: Command, ok: bool, step: int | None, message: str) -> None:
        self.server.publish(Ack(id=cmd.id, name=cmd.name, ok=ok, step=step, message=message))
        self.event("command", f"{cmd.name}: {message}" if ok else f"{cmd.name} refused: {message}",
                   id=cmd.id, name=cmd.name, value=cmd.value, ok=ok, applied_step=step)

    def heartbeat(self) -> None:
        """Called from the pause loop; a hook for DDP's keep-alive collective."""

    def kill(self) -> None:
        """Immediate end, from the server thread: flush what we can, then SIGKILL ourselves."""
        self.event("run", "killed on request")
        self.set_state("crashed")
        try:
            rundir.update_info(self.run_dir, status="crashed", exit_code=-signal.SIGKILL, ended=time.time())
        except OSError:
            pass
        os.kill(os.getpid(), signal.SIGKILL)

    def start_profile(self, cmd: Command, step: int) -> None:
        self.ack(cmd, False, step, "profiling is not available yet")

    def checkpoint(self, step: int, reason: str) -> str:
        """Save a checkpoint now (training thread); return a one-line summary."""
        t0 = time.perf_counter()
        optimizers = self.hooks.live(self.hooks.optimizers)
        if not self.hooks.models and optimizers:
            self.hooks.set_models(checkpoint.find_models(optimizers))
        journal = [e for e in self._journal() if e["kind"] == "command"]
        obj = checkpoint.build(
            step, self.hooks.models, optimizers, self.hooks.top_schedulers(),
            self.hooks.live(self.hooks.scalers),
            {"run_id": self.info["id"], "reason": reason,
             "controls": {"clip": self.settings.clip, "lr_scale": self.settings.lr_scale},
             "journal": journal})
        path = self.run_dir / "checkpoints" / f"step-{step}.pt"
        size = checkpoint.save_atomic(obj, path)
        seconds = time.perf_counter() - t0
        keep = int(self.config.get("keep_last") or 0)
        if keep:
            checkpoint.prune(path.parent, keep)
        self._last_checkpoint_time = time.monotonic()
        summary = f"saved {path} ({size / 1e6:.1f} MB in {seconds:.2f} s)"
        self.event("checkpoint", summary, path=str(path), bytes=size, seconds=seconds, reason=reason)
        return summary

    def _apply_resume(self) -> None:
        ckpt, self._resume = self._resume, None
        optimizers = self.hooks.live(self.hooks.optimizers)
        if not self.hooks.models and optimizers:
            self.hooks.set_models(checkpoint.find_models(optimizers))
        warnings = checkpoint.apply(ckpt, self.hooks.models, optimizers, self.hooks.top_schedulers(),
                                    self.hooks.live(self.hooks.scalers))
        self.event("run", f"resumed from {self.config['resume']} at step {self.start_step}"
                   + (f" ({'; '.join(warnings)})" if warnings else ""))

    def _journal(self) -> list[dict]:
        from .store import StoreReader

        try:
            with StoreReader(self.run_dir / STORE_NAME) as reader:
                return reader.events()
        except Exception:
            return []

    # ------------------------------------------------------ called by the hooks

    def on_discovered(self, opt) -> None:
        """After the first step: name what was found, learn the schedule length."""
        for sched in self.hooks.live(self.hooks.schedulers):
            total = getattr(sched, "total_steps", None)
            if isinstance(total, int):
                self.total_steps = total
        names = checkpoint.model_names(self.hooks.models)
        self.event("run", f"found model {', '.join(names) or 'none'}, "
                          f"{len(self.hooks.live(self.hooks.optimizers))} optimizer(s), "
                          f"{len(self.hooks.top_schedulers())} scheduler(s)",
                   models=names)
        if self.state == "starting":
            self.set_state("running")

    def on_zero_grad(self, opt) -> None:
        """Hook point for the doctor's rules."""

    def on_step_end(self, step: int) -> None:
        if self.state == "starting":
            self.set_state("running")
        every = self.config.get("checkpoint_every")
        every_s = self.config.get("checkpoint_every_s")
        if (every and step % int(every) == 0) or (
                every_s and time.monotonic() - self._last_checkpoint_time >= float(every_s)):
            self.controls.request_checkpoint("periodic")

    def fill_record(self, record) -> None:
        """Add values logged with ``ptdash.log`` since the previous step."""
        if self._user_values:
            with self._lock:
                values, self._user_values = self._user_values, {}
            for name, value in values.items():
                if isinstance(value, torch.Tensor):
                    record.device[name] = value.detach().float().reshape(())
                else:
                    record.host[name] = float(value)

    # ------------------------------------------------------------- public API

    def log(self, values: dict, step: int | None = None) -> None:
        with self._lock:
            for name, value in values.items():
                self._user_values[f"user/{name}"] = value

    def watch(self, model=None, optimizer=None, scheduler=None, scaler=None) -> None:
        import weakref

        def as_list(x):
            return [] if x is None else list(x) if isinstance(x, (list, tuple)) else [x]

        if model is not None:
            self.hooks.set_models(as_list(model))
        for objs, registry in ((optimizer, self.hooks.optimizers), (scheduler, self.hooks.schedulers),
                               (scaler, self.hooks.scalers)):
            for obj in as_list(objs):
                if not any(r() is obj for r in registry):
                    registry.append(weakref.ref(obj))
        for obj in as_list(scheduler):
            total = getattr(obj, "total_steps", None)
            if isinstance(total, int):
                self.total_steps = total

    # --------------------------------------------------------------- flushing

    def _flush_loop(self) -> None:
        last_status = 0.0
        while not self._stop.wait(self.flush_interval):
            try:
                self._flush()
                now = time.monotonic()
                if now - last_status >= 1.0:
                    self.server.publish(self.status())
                    last_status = now
            except Exception:  # keep flushing; never take training down
                log.exception("flush failed")

    def _flush(self) -> None:
        rows, layers = self.recorder.drain()
        with self._lock:
            events, self._events = self._events, []
        if rows or events:
            self.store.write(rows=rows, events=events)
        if rows:
            self.server.publish(Metrics(rows=rows))
