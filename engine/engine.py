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
import os
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path

import torch

from . import checkpoint, profiling, system
from .controls import Controls, Settings
from .distributed import Distributed
from .doctor import Doctor
from .hooks import Hooks
from .monitor import Monitor
from .recorder import Recorder, _to_host
from .shared import rundir
from .shared.config import RunConfig
from .shared.numbers import json_safe
from .shared.protocol import Ack, Command, Event, LayerNames, Layers, Metrics, Status, Welcome, from_dict, to_dict
from .shared.store import STORE_NAME, StoreWriter
from .shared.transport import Server

log = logging.getLogger("ptdash.engine")

ENGINE: Engine | None = None
"""The engine of this process, for the public API in ``ptdash/__init__.py``."""


class Engine:
    """One process's instrumentation: hooks, controls, store, server, flusher.

    Under DDP every rank has an engine; only rank 0's (the primary) owns the run dir, the
    store and the socket. The others hand their rows to it (see distributed.py).
    """

    def __init__(self, run_dir: Path | None, config: RunConfig) -> None:
        self.dist = Distributed()
        self.primary = self.dist.rank == 0
        self.run_dir = Path(run_dir).resolve() if run_dir is not None else None
        self.info = rundir.read_info(self.run_dir) if self.primary else None
        self.config = config
        self.settings = Settings(clip=config.clip, lr_scale=config.lr_scale or 1.0)
        self.controls = Controls(self.settings, self, self.dist if self.dist.multi else None)
        self.recorder = Recorder()
        self.hooks = Hooks(self)
        self.flush_interval = config.flush_interval
        self.start_step = 0
        self.state = "starting"
        self.paused_at: int | None = None
        self.total_steps: int | None = None
        self.exit_code: int | None = None
        self.detail = ""
        self._events: list[Event] = []
        self.user_values: dict = {}
        """Values given to ``ptdash.log`` since the previous step."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._flush_soon = threading.Event()
        self._periodic = False
        self._flusher: threading.Thread | None = None
        self._resume: dict | None = None
        self._last_checkpoint_time = time.monotonic()
        self.monitor = Monitor()
        self.doctor = Doctor(self.event, config, lambda: self.hooks.models, lambda: self.hooks.step)
        self.sampler = system.SystemSampler()
        self._profile: profiling.ProfileWindow | None = None
        self._layer_key: tuple = ()
        self._layer_names: list[str] = []
        self._layer_shapes: list[list[int]] = []
        self._sent_names: list[str] | None = None
        self.layer_names: LayerNames | None = None
        """The parameter names the latest Layers messages follow (sent to each new dashboard)."""
        self._started = self._last_layer_record = time.monotonic()
        self._rank_progress: dict[int, tuple[int, float]] = {}
        self._stalled: set[int] = set()
        self.store: StoreWriter | None = None
        self.server: Server | None = None
        if self.primary:
            self.store = StoreWriter(self.run_dir / STORE_NAME)
            self.server = Server(
                Path(self.info.socket), rundir.read_token(self.run_dir),
                Welcome(run_id=self.info.id, run_dir=str(self.run_dir), pid=os.getpid(),
                        world_size=self.dist.world_size),
                on_command=self.controls.submit, on_connect=self._greeting)

    def _greeting(self) -> list:
        """What a dashboard gets after the Welcome: the status, and the parameter names."""
        return [self.status()] + ([self.layer_names] if self.layer_names is not None else [])

    def _publish(self, msg) -> None:
        if self.server is not None:
            self.server.publish(msg)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Install hooks, open the socket, start the flusher. Called before the script runs."""
        global ENGINE
        ENGINE = self
        if self.config.resume:
            self._resume = checkpoint.load(Path(self.config.resume))
            self.start_step = int(self._resume["ptdash"]["step"])
            saved = self._resume["ptdash"].get("controls", {})
            self.settings.clip = saved.get("clip", self.settings.clip) if self.config.clip is None else self.settings.clip
            self.settings.lr_scale = saved.get("lr_scale", 1.0) if self.config.lr_scale is None else self.settings.lr_scale
        self.hooks.step = self.start_step
        self._periodic = bool(self.config.profile_steps or self.config.checkpoint_every
                              or self.config.checkpoint_every_s)
        """Whether each step end checks for a profile window or a periodic checkpoint."""
        self.hooks.update_ratio_every = self.config.update_ratio_every
        if self.config.memory_history:
            system.memory_history_start()
        self.hooks.attach()
        self.doctor.attach()
        if self._resume is not None:
            self.hooks.arm_resume(self._apply_resume)
        if self.primary:
            self.server.start()
            rundir.register(self.info.id, self.run_dir)
            rundir.update_info(self.run_dir, status="running", pid=os.getpid(), started=time.time(),
                               torch_version=torch.__version__, start_step=self.start_step,
                               world_size=self.dist.world_size)
            self.store.set_meta(config=self.config.to_json(), run=self.info.to_json(), world_size=self.dist.world_size)
            self.event("run", f"started{' from step %d' % self.start_step if self.start_step else ''}"
                       + (f" with {self.dist.world_size} ranks" if self.dist.multi else ""))
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
        self.doctor.detach()
        if self.dist.ready and self.primary and self.dist.exchanges:
            steps = max(1, self.hooks.step - self.start_step)
            self.event("run", f"rank channel: {self.dist.exchanges} command exchanges over {steps} steps, "
                              f"{self.dist.exchange_seconds / self.dist.exchanges * 1e3:.2f} ms each, "
                              f"{self.dist.exchange_seconds / steps * 1e6:.0f} us per step on average",
                       exchanges=self.dist.exchanges, seconds=self.dist.exchange_seconds, steps=steps)
        self.exit_code = exit_code
        self.detail = detail
        self.set_state(state)
        self.event("run", f"{state} with exit code {exit_code}" + (f": {detail.splitlines()[-1]}" if detail else ""))
        self._stop.set()
        self._flush_soon.set()
        if self._flusher is not None:
            self._flusher.join(timeout=10)
        self._flush()
        if self.primary:
            self.server.stop()
            self.store.close()
            rundir.update_info(self.run_dir, status=state, exit_code=exit_code, ended=time.time(),
                               step=self.hooks.step)
            rundir.unregister(self.info.id)
        ENGINE = None

    def setup_distributed(self) -> None:
        """At the first optimizer step (every rank): join the command channel if DDP is on."""
        if self.dist.multi and self.dist.setup() and self.primary:
            self.event("run", f"rank channel up: {self.dist.world_size} ranks")

    # -------------------------------------------------------------- state, events

    def status(self) -> Status:
        return Status(state=self.state, step=self.hooks.step, total_steps=self.total_steps,
                      paused_at=self.paused_at, clip=self.settings.clip, lr_scale=self.settings.lr_scale,
                      exit_code=self.exit_code, detail=self.detail)

    def set_state(self, state: str | None, **changes) -> None:
        """Change the run state (None: only settings changed) and tell every dashboard."""
        if state is not None:
            self.state = state
            self._flush_soon.set()
        if "paused_at" in changes:
            self.paused_at = changes["paused_at"]
        status = self.status()
        self._publish(status)
        if self.primary:
            try:
                rundir.update_info(self.run_dir, status=status.state, step=status.step, paused_at=status.paused_at,
                                   total_steps=status.total_steps, clip=status.clip, lr_scale=status.lr_scale)
            except (OSError, ValueError):
                log.exception("could not update run.json")

    def event(self, kind: str, message: str, **data) -> None:
        """Journal an event (stored at the next flush) and publish it now."""
        ev = Event(kind=kind, step=self.hooks.step, wall=time.time(), message=message, data=json_safe(data)[0],
                   rank=self.dist.rank)
        with self._lock:
            self._events.append(ev)
        self._publish(ev)

    # -------------------------------------------------- effects used by Controls

    def ack(self, cmd: Command, ok: bool, step: int | None, message: str) -> None:
        if not self.primary:
            return
        self._publish(Ack(id=cmd.id, name=cmd.name, ok=ok, step=step, message=message))
        self.event("command", f"{cmd.name}: {message}" if ok else f"{cmd.name} refused: {message}",
                   id=cmd.id, name=cmd.name, value=cmd.value, ok=ok, applied_step=step)

    def step_seconds(self) -> float:
        return self.hooks.last_step_s

    def kill(self) -> None:
        """Immediate end, from the server thread: flush what we can, then SIGKILL every rank here."""
        self.event("run", "killed on request")
        for pid in self.dist.local_pids():
            if pid != os.getpid():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.set_state("crashed")
        try:
            rundir.update_info(self.run_dir, status="crashed", exit_code=-signal.SIGKILL, ended=time.time())
        except OSError:
            pass
        os.kill(os.getpid(), signal.SIGKILL)

    def start_profile(self, cmd: Command | None, step: int, steps: int | None = None) -> None:
        """Profile the next steps with torch.profiler (training thread, at a step start)."""
        steps = int(steps if steps is not None else cmd.value)
        if not self.primary:
            return  # rank 0 profiles; the others keep their pace
        if self._profile is not None:
            if cmd is not None:
                self.ack(cmd, False, step, "a profile is already being recorded")
            return
        window = profiling.ProfileWindow(steps, self.run_dir / "profiles", step + 1)
        window.start()
        if window.error:
            if cmd is not None:
                self.ack(cmd, False, step, window.error)
            return
        self._profile = window
        if cmd is not None:
            self.ack(cmd, True, step, f"profiling steps {step + 1}-{step + steps}")

    def _profile_step(self) -> None:
        window = self._profile
        if window is not None and window.on_step():
            self._profile = None
            window.stop()
            # Building the table takes about a second: off the training thread.
            threading.Thread(target=self._profile_report, args=(window,), name="ptdash-profile",
                             daemon=True).start()

    def _profile_report(self, window) -> None:
        report = window.report()
        a, b = report.get("steps", ["?", "?"])
        if report.get("error"):
            self.event("profile", f"profile of steps {a}-{b} failed: {report['error']}", **report)
            return
        top = report["top"][0]["name"] if report.get("top") else "nothing"
        self.event("profile", f"profiled steps {a}-{b}: top op {top}; trace {report['trace']}", **report)

    def on_nonfinite(self, opt, step: int, per_tensor, params) -> None:
        """A non-finite loss or gradient before step ``step``'s update (CPU: exact)."""
        import torch

        name = "the loss"
        if per_tensor is not None and per_tensor.numel():
            bad = (~torch.isfinite(per_tensor)).nonzero()
            if bad.numel():
                name = self._names_for(params)[int(bad[0])]
        action = self.config.on_anomaly
        self.event("anomaly", f"non-finite gradient before the update of step {step}, first in {name}"
                   + {"pause": "; paused before the update", "skip": "; update skipped",
                      "warn": ""}[action], step=step, layer=name, action=action)
        if action == "warn":
            return
        if action == "pause":
            self.controls.pause_here(step - 1, name)
        for group in opt.param_groups:
            for p in group["params"]:
                p.grad = None  # the optimizer skips parameters without gradients
        if action == "pause":
            self.event("anomaly", f"skipped the non-finite update of step {step}", step=step)

    def checkpoint(self, step: int, reason: str) -> str:
        """Save a checkpoint now (training thread, every rank); return a one-line summary.

        Under DDP rank 0 writes it, and it counts as complete only once every rank has
        reached the barrier after the write.
        """
        self.dist.barrier()
        try:
            return self._save(step, reason) if self.primary else ""
        finally:
            self.dist.barrier()

    def _save(self, step: int, reason: str) -> str:
        t0 = time.perf_counter()
        optimizers = self.hooks.live(self.hooks.optimizers)
        if not self.hooks.models and optimizers:
            self.hooks.set_models(checkpoint.find_models(optimizers))
        journal = [to_dict(e) for e in self._journal() if e.kind == "command"]
        obj = checkpoint.build(
            step, self.hooks.models, optimizers, self.hooks.top_schedulers(),
            self.hooks.live(self.hooks.scalers),
            {"run_id": self.info.id, "reason": reason,
             "controls": {"clip": self.settings.clip, "lr_scale": self.settings.lr_scale},
             "journal": journal})
        path = self.run_dir / "checkpoints" / f"step-{step}.pt"
        size = checkpoint.save_atomic(obj, path)
        seconds = time.perf_counter() - t0
        keep = self.config.keep_last or 0
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
        self.event("run", f"resumed from {self.config.resume} at step {self.start_step}"
                   + (f" ({'; '.join(warnings)})" if warnings else ""))

    def on_crash(self, exc: BaseException) -> None:
        """The script raised: an out-of-memory error gets the allocator report and remedies."""
        self.doctor.on_crash(exc)
        if isinstance(exc, torch.OutOfMemoryError):
            report = system.oom_report(error=exc)
            if self.config.memory_history and self.primary:
                path = self.run_dir / "memory-snapshot.pickle"
                if system.memory_history_dump(path):
                    report["snapshot"] = str(path)
            self.event("oom", "out of memory: " + "; ".join(report["remedies"]), **report)

    def _journal(self) -> list[Event]:
        from .shared.reader import StoreReader

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

    def on_step_end(self, step: int) -> None:
        if self.state == "starting":
            self.set_state("running")
        if self._profile is not None:
            self._profile_step()
        if not self._periodic:
            return
        window = self.config.profile_steps
        if window and step + 1 == window[0]:
            self.start_profile(None, step, window[1] - window[0] + 1)
        every = self.config.checkpoint_every
        every_s = self.config.checkpoint_every_s
        if (every and step % int(every) == 0) or (
                every_s and time.monotonic() - self._last_checkpoint_time >= float(every_s)):
            self.controls.request_checkpoint("periodic")

    def take_user_values(self) -> dict:
        """Values logged with ``ptdash.log`` since the previous step (tensors stay on device)."""
        with self._lock:
            values, self.user_values = self.user_values, {}
        return {name: value.detach().reshape(()) if isinstance(value, torch.Tensor) else float(value)
                for name, value in values.items()}

    # ------------------------------------------------------------- public API

    def log(self, values: dict, step: int | None = None) -> None:
        with self._lock:
            for name, value in values.items():
                self.user_values[f"user/{name}"] = value

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
        last_status = last_system = 0.0
        # Slow steps are flushed a few at a time (each flush has a fixed cost: a store
        # transaction, a per-layer record, messages); fast ones a few times a second.
        while not self._stop.is_set():
            # A state change (a pause, a stop) wakes it early, so the store shows where it happened.
            self._flush_soon.wait(min(1.0, max(self.flush_interval, 4 * self.hooks.last_step_s)))
            self._flush_soon.clear()
            if self._stop.is_set():
                break
            try:
                now = time.monotonic()
                system_row = None
                if now - last_system >= 1.0:
                    system_row = self._system_row()
                    last_system = now
                self._flush(system_row)
                if now - last_status >= 1.0:
                    self._publish(self.status())
                    last_status = now
            except Exception:  # keep flushing; never take training down
                log.exception("flush failed")

    def _system_row(self) -> list:
        values = {k: v for k, v in self.sampler.sample().items() if v is not None}
        return [self.hooks.step, time.time(), values]

    def _flush(self, system_row: list | None = None) -> None:
        rows, layer_rows = self.recorder.drain()
        self.doctor.on_flush(rows, layer_rows, _to_host)
        for kind, message, data in self.monitor.check_rows(rows):
            self.event(kind, message, **data)
        self._deferred_anomaly(rows)
        layers_msg, records = None, []
        if layer_rows:
            last = layer_rows[-1]
            names = self._names_for(last.params)
            fresh = names is not self._sent_names
            flags, findings = self.monitor.check_layers(last.step, names, last.grad_norms)
            for row in layer_rows[:-1]:
                if None in row.grad_norms:  # a non-finite step inside the flush: name it
                    findings += self.monitor.check_layers(row.step, self._names_for(row.params), row.grad_norms)[1]
            for kind, message, data in findings:
                self.event(kind, message, **data)
            ratios = next((r.update_ratios for r in reversed(layer_rows) if r.update_ratios is not None), None)
            layers_msg = Layers(step=last.step, grad_norms=last.grad_norms, update_ratios=ratios, flags=flags)
            self._sent_names = names
            if fresh:
                self.layer_names = LayerNames(step=last.step, names=names, shapes=self._layer_shapes)
                records.append(self.layer_names)
                self._publish(self.layer_names)
            if fresh or self._layer_record_due():
                records.append(layers_msg)
        with self._lock:
            events, self._events = self._events, []
        extra = [system_row] if system_row else []
        if not self.primary:
            if rows or events or extra:
                self.dist.push({"rows": rows, "events": [to_dict(e) for e in events], "extra": extra})
            return
        if rows or events or records or extra:
            self.store.write(rows=rows, events=events, layers=records, extra=extra)
        if rows or extra:
            self._publish(Metrics(rows=rows + extra))
        if layers_msg is not None:
            self._publish(layers_msg)
        if self.dist.multi:
            self._collect_ranks(rows)

    def _collect_ranks(self, own_rows: list) -> None:
        """Rank 0: store and publish what the other ranks pushed; name stalled ranks."""
        now = time.monotonic()
        if own_rows:
            self._rank_progress[0] = (own_rows[-1][0], now)
        for rank, payload in self.dist.pull():
            events = [replace(e, rank=rank) for e in map(from_dict, payload["events"]) if isinstance(e, Event)]
            self.store.write(rows=payload["rows"], rank=rank, events=events, extra=payload["extra"])
            for event in events:
                self._publish(event)
            if payload["rows"] or payload["extra"]:
                self._publish(Metrics(rows=payload["rows"] + payload["extra"], rank=rank))
            if payload["rows"]:
                self._rank_progress[rank] = (payload["rows"][-1][0], now)
                self._stalled.discard(rank)
        limit = self.config.stall_seconds
        if self.state != "running":
            return
        for rank, (step, since) in self._rank_progress.items():
            if now - since > limit and rank not in self._stalled:
                self._stalled.add(rank)
                self.event("anomaly", f"rank {rank} stalled: no step for {now - since:.0f} s (at step {step})",
                           stalled_rank=rank, step=step)

    def _layer_record_due(self) -> bool:
        """Per-layer history is stored once a second for ten minutes, then every ten seconds:
        a 500-parameter model then costs the store about 2 MB an hour, not 70."""
        now = time.monotonic()
        interval = 1.0 if now - self._started < 600 else 10.0
        if now - self._last_layer_record >= interval:
            self._last_layer_record = now
            return True
        return False

    def _deferred_anomaly(self, rows: list) -> None:
        """Off the CPU, a non-finite step is seen here, at the flush: pause at the next step.

        Checking on the training thread would cost a host sync per step; the price of not
        doing so is that the bad update (and the few after it) have been applied.
        """
        if self.hooks.grad_device == "cpu" or self.config.on_anomaly != "pause":
            return
        bad = next((step for step, _, values in rows
                    if ("loss" in values and values["loss"] is None)
                    or ("grad/norm_total" in values and values["grad/norm_total"] is None)), None)
        if bad is not None and not self.controls.paused and not self.controls.requested_pause:
            self.event("anomaly", f"non-finite loss or gradient at step {bad}, seen at the flush; "
                                  "pausing at the next step", step=bad, action="pause")
            self.controls.submit(Command(id=f"anomaly-{bad}", name="pause"))

    def _names_for(self, params: list) -> list[str]:
        """Parameter names for a list of parameters (cached while the list's shape holds)."""
        key = (len(params), id(params[0]) if params else 0, id(params[-1]) if params else 0,
               tuple(id(m) for m in self.hooks.models))
        if key != self._layer_key:
            by_id = {}
            for model in self.hooks.models:
                for name, p in checkpoint.unwrap(model).named_parameters():
                    by_id.setdefault(id(p), name)
            self._layer_names = [by_id.get(id(p), f"param{i}") for i, p in enumerate(params)]
            self._layer_shapes = [list(p.shape) for p in params]
            self._layer_key = key
        return self._layer_names

