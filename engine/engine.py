"""The engine: builds ptdash's parts inside the training process and runs their lifecycle.

Threads:
- the training thread runs the script; the hooks record each step and apply commands;
- the flusher (``ptdash-flush``, flusher.py) moves records to the host a few times a
  second, writes them to the store, samples the system and publishes to the dashboard;
- the server (``ptdash-server``, shared/transport.py) accepts dashboards and queues commands.

The training thread never waits for the other two. The parts, and who they talk to:

```
 hooks ──records──▶ recorder ──drain──▶ flusher ──▶ store, dashboards (or rank 0)
   │  └─non-finite─▶ anomalies ◀──rows──┘  │
   ├─step boundary─▶ controls ──▶ checkpointer, profiler, journal
   └─watched steps─▶ doctor ──findings──▶ journal ◀── every part's events
 discovery: the script's optimizers, schedulers, scalers, models
```
"""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

import torch

from . import link, nodes, recovery_parts, system
from .budget import Budget
from .checkpoint import Checkpointer
from .controls import NO_OPTIMIZER, Controls, Settings
from .discovery import Discovery, model_names
from .distributed import Distributed, env_rank
from .doctor import Doctor
from .flusher import Flusher, LayerNaming
from .hooks import Hooks
from .hub import Hub
from .journal import Journal
from .patching import Patches
from .preview import SchedulePreview
from .printed import PrintedMetrics
from .profiling import Profiler
from .ranks import RankCollector, push_interval
from .recorder import Recorder
from .shared import events, rundir
from .shared.config import RunConfig
from .shared.limits import check_setting
from .shared.protocol import Event, LayerNames, Metrics, Samples, Schedule, Status, Welcome
from .shared.store import STORE_NAME, StoreWriter
from .shared.transport import Server
from .shared.wire import from_dict
from .stackgather import StackGatherer
from .stacks import StackTaker
from .uservalues import UserValues

log = logging.getLogger("ptdash.engine")

RANKS_GONE_SECONDS = 10.0
"""How long the hub's end waits for the other ranks' last flushes."""

ENGINE: Engine | None = None
"""The engine of this process, for the public API in ``ptdash/__init__.py``."""


class Engine:
    """One process's instrumentation, wired from its parts.

    Under DDP every rank has an engine. The hub's (``primary``: the process ptdash
    started) owns the store, run.json, the dashboards' socket and the command inbox; the
    others hand their rows to it over the rank link (hub.py, link.py). Rank 0 (``leads``)
    speaks for the run: its journal answers commands, it judges the loss, saves
    checkpoints and previews the schedule; in another process than the hub, what it
    tells the dashboards goes through the hub.
    """

    def __init__(self, run_dir: Path | None, config: RunConfig, hub: bool | None = None) -> None:
        self.config = config
        self.pid = os.getpid()
        self.run_dir = Path(run_dir).resolve() if run_dir is not None else None
        self.primary = env_rank()[0] == 0 if hub is None else hub
        self.info = rundir.read_info(self.run_dir) if self.run_dir is not None else None
        token = rundir.read_token(self.run_dir) if self.run_dir is not None else ""
        self.hub = (Hub(link.socket_path(self.info.socket), token, self._take_commands, self._queued_commands,
                        self._rank_data, self._leader_message, self._hub_event) if self.primary else None)
        target, hello = nodes.rank_target(config.to_json(), link.socket_path(self.info.socket) if self.info else None)
        self.dist = Distributed(self.hub, target, token, hello)
        self.nodeport = None  # the hub's TCP port for the other nodes of a job of several (nodes.py)
        leads = self.dist.rank == 0
        self._leader_greeting: dict[str, object] = {}
        """The newest LayerNames and Schedule of a rank 0 in another process, for new dashboards."""
        self.settings = Settings(clip=config.clip, lr_scale=config.lr_scale or 1.0)
        self.server: Server | None = None
        self.store: StoreWriter | None = None
        self.discovery = Discovery()
        self.budget = Budget(config.overhead_budget)
        self.recorder = Recorder(self.budget.observe)
        self.user_values = UserValues()
        self._log_warned: set[str] = set()
        self.journal = Journal(self._publish, lambda: self.hooks.step, self.settings, rank=self.dist.rank,
                               run_dir=self.run_dir if self.primary else None, wake=lambda: self.flusher.wake())
        self.checkpointer = Checkpointer(self.run_dir, self.info.id if self.info else "",
                                         self.discovery, self.journal, self.settings, config, self.dist.barrier, leads)
        self.profiler = Profiler(self.run_dir / "profiles" if leads and self.run_dir else None, self.journal,
                                 config.profile_steps)
        self.controls = Controls(self.settings, self.journal, self.checkpointer.save, self.profiler.start, self.kill,
                                 lambda: self.hooks.state.last_step_s, self.dist)
        if self.hub is not None:
            self.controls.refuse_partial = lambda: self.hub.partial
            self.controls.on_queued = self.hub.wake
        self.doctor = Doctor(self.journal.event, config, lambda: self.discovery.models, lambda: self.hooks.step,
                             lambda: self.hooks.loaders.describe(), judge_loss=leads)
        recovery = recovery_parts.build(config=config, leads=leads, journal=self.journal, controls=self.controls,
                                        settings=self.settings, discovery=self.discovery, dist=self.dist,
                                        state=lambda: self.hooks.state)
        self.judge, self.anomalies, self.rollback = recovery.judge, recovery.anomalies, recovery.rollback
        self.controls.rollback = self.rollback
        self.hooks = Hooks(self.settings, self.controls, self.recorder, self.doctor, self.discovery, self.anomalies,
                           self.user_values, self.journal, self.budget, self._first_step, self._discovered,
                           self._step_end)
        self.controls.lr_refusal = lambda: NO_OPTIMIZER if self.hooks.inferred.optimizer_less() else None
        self.naming = LayerNaming(self.discovery)
        self._patches = Patches()
        """The engine's own patches (the resumed run's scheduler guard)."""
        if self.primary:
            self.store = StoreWriter(self.run_dir / STORE_NAME)
            self.server = Server(
                Path(self.info.socket), rundir.read_token(self.run_dir),
                Welcome(run_id=self.info.id, run_dir=str(self.run_dir), pid=os.getpid(),
                        world_size=self.dist.world_size),
                on_command=self.controls.submit, on_connect=self._greeting, on_drop=self.journal.event)
        self.preview = (SchedulePreview(self.discovery, lambda: self.hooks.main.ref() if self.hooks.main else None,
                                        lambda: self.hooks.step, lambda: self.settings.lr_scale,
                                        lambda: self.journal.total_steps,
                                        on_end=self._schedule_end) if leads else None)
        self.stacks = StackTaker(lambda: self.dist.rank, lambda: self.hooks.step, answers=self.dist)
        self.ranks = (RankCollector(self.store, self._publish, self.journal.event, lambda: self.journal.state,
                                    config.stall_seconds, self.hub.rank_pids, self._stalled) if self.primary else None)
        self.printed = (PrintedMetrics(lambda: self.hooks.step, self.journal.event, self.user_values.names)
                        if config.parse_output else None)
        """The metrics the script prints; the output relay feeds it (bootstrap.py), the flusher drains it."""
        self.gatherer = StackGatherer(self.hub, self.stacks.take, self._publish, self.ranks, self.controls,
                                      lambda: self.nodeport) if self.primary else None
        self.flusher = Flusher(self.recorder, self.journal, self.doctor, self.anomalies, self.naming,
                               system.SystemSampler(), self._publish, store=self.store, printed=self.printed,
                               stepped=self.user_values.drain_at, push=None if self.primary else self.dist.push,
                               ranks=self.ranks, interval=config.flush_interval, schedule=self.preview,
                               step_seconds=lambda: self.hooks.state.last_step_s, budget=self.budget)
        self.flusher.push_layers = leads and not self.primary
        self._periodic = bool(config.checkpoint_every or config.checkpoint_every_s)
        """Whether each step end checks for a periodic checkpoint."""

    @property
    def start_step(self) -> int:
        """The step this run continues from (``--resume``), else 0."""
        return self.checkpointer.start_step

    def _publish(self, msg) -> None:
        if self.server is not None:
            self.server.publish(msg)
        elif self.dist.rank == 0 and not isinstance(msg, (Event, Metrics, Samples)):
            # Rank 0 in another process: its status, acks and layer records reach the
            # dashboards through the hub (events, rows and readings go with its flushes).
            self.dist.publish(msg)

    def _greeting(self) -> list:
        """What a dashboard gets after the Welcome: the status, the parameter names, the schedule ahead."""
        names = self.naming.names or self._leader_greeting.get("names")
        schedule = (self.preview.latest if self.preview is not None else None) or self._leader_greeting.get("schedule")
        return [self.journal.status()] + [m for m in (names, schedule) if m is not None]

    # --------------------------------------------------------- the hub's side (server threads)

    def _take_commands(self, n: int) -> list:
        return self.controls.take(n)

    def _queued_commands(self) -> int:
        return self.controls.queued()

    def _rank_data(self, rank: int, payload: dict) -> None:
        """A flush of a rank in another process (its rows, events, readings; rank 0's layer records)."""
        self.ranks.receive(rank, payload)

    def _leader_message(self, rank: int, body: dict) -> None:
        """What rank 0, in another process, tells the dashboards: its status becomes the run's."""
        try:
            msg = from_dict(body)
        except (ValueError, TypeError, KeyError) as exc:
            log.warning("rank 0 sent a message that does not decode: %s", exc)
            return
        if isinstance(msg, Status):
            self.journal.mirror(msg)
            return
        if isinstance(msg, LayerNames):
            self._leader_greeting["names"] = msg
        elif isinstance(msg, Schedule):
            self._leader_greeting["schedule"] = msg
            if msg.end is not None and self.config.steps is None:
                self.journal.total_steps = msg.end
        self._publish(msg)

    def _stalled(self, text: str | None) -> None:
        """No rank makes steps (``text`` says which stalled), or they do again: run.json says so for ``ls``."""
        try:
            rundir.update_info(self.run_dir, stalled=text)
        except (OSError, ValueError):
            log.exception("could not update run.json")

    def _hub_event(self, what: events.EventData | str, message: str, info: dict | None = None) -> None:
        """The hub's events; ``info``: what run.json says from now on (world size, hosts, lost nodes)."""
        self.journal.event(what, message)
        if info:
            try:
                rundir.update_info(self.run_dir, **info)
            except (OSError, ValueError):
                log.exception("could not update run.json")

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Install hooks, open the socket, start the flusher. Called before the script runs."""
        global ENGINE
        ENGINE = self
        saved = self.checkpointer.load_resume()
        if saved is not None:
            # A checkpoint's settings pass the commands' checks too: the file may be anyone's.
            clip, scale = saved.get("clip"), saved.get("lr_scale", 1.0)
            if self.config.clip is None and (clip is None or not check_setting("clip", clip)):
                self.settings.clip = clip
            if self.config.lr_scale is None and not check_setting("lr_scale", scale):
                self.settings.lr_scale = float(scale)
                self.controls.lr_origin = f"the LR factor of {Path(self.config.resume).name}"
        self.hooks.step = self.start_step
        self.journal.total_steps = self.config.steps
        self.hooks.state.update_ratio_every = self.config.update_ratio_every
        if self.config.memory_history:
            system.memory_history_start()
        self.hooks.attach()
        self.doctor.attach()
        self.stacks.collectives.attach(self._patches)
        if self.checkpointer.resuming:
            self.hooks.arm_resume(self.checkpointer.apply_resume)
            self.checkpointer.guard_schedulers(self._patches, lambda: self.hooks.step)
        if self.primary:
            self.hub.start()
            self.nodeport = nodes.open_port(self.hub, self.config.to_json(), self.info, self._hub_event)
            self.server.start()
            rundir.register(self.info.id, self.run_dir)
            rundir.update_info(self.run_dir, status="running", pid=os.getpid(), started=time.time(),
                               torch_version=torch.__version__, start_step=self.start_step,
                               world_size=self.dist.world_size)
            self.store.set_meta(config=self.config.to_json(), run=self.info.to_json(), world_size=self.dist.world_size)
            self.journal.event("run", f"started{' from step %d' % self.start_step if self.start_step else ''}"
                               + (f" with {self.dist.world_size} ranks" if self.dist.multi else ""))
        else:
            self.dist.connect()  # register with the hub now: the channel decision needs every rank
        self.flusher.start()

    def finish(self, state: str, exit_code: int, detail: str = "") -> None:
        """Record how the script ended, flush everything, close the socket."""
        global ENGINE
        if state == "finished":
            self.hooks.end_manual_step()
        if self.controls.pending.checkpoint and state == "finished":
            try:
                self.controls.at_save_point(self.hooks.step)
            except Exception:
                log.exception("final checkpoint failed")
        self.profiler.close(self.hooks.step)
        self.hooks.detach()
        self.doctor.detach()
        self._patches.undo()
        dist = self.dist
        if dist.ready and dist.rank == 0 and dist.exchanges:
            self.journal.event(*dist.cost_note(max(1, self.hooks.step - self.start_step)))
        if state == "finished" and self.journal.leader_ended == "stopped":
            state = "stopped"  # rank 0 in another process was stopped; then the script ended
        self.journal.set_state(state, exit_code=exit_code, detail=detail)
        who = "" if self.primary else f"rank {self.dist.rank} "
        self.journal.event("run", f"{who}{state} with exit code {exit_code}"
                           + (f": {detail.splitlines()[-1]}" if detail else ""))
        self.user_values.settle(self.hooks.step)
        self.flusher.stop()
        self.flusher.flush(sample=True)
        if self.preview is not None:
            self.preview.close()
        if not self.primary:
            dist.close()
        else:
            # The other ranks end at the same step: their last flushes come as they close.
            if not self.hub.wait_ranks_gone(RANKS_GONE_SECONDS):
                log.warning("ranks still connected %.0f s after the end; their last rows may be missing",
                            RANKS_GONE_SECONDS)
            self.flusher.flush()  # what other ranks sent meanwhile
            self.hub.stop()
            if self.nodeport is not None:
                self.nodeport.stop()
            self.server.stop()
            self.store.close()
            rundir.update_info(self.run_dir, status=state, exit_code=exit_code, ended=time.time(),
                               step=self.journal.step(), detail=detail.strip().splitlines()[-1] if detail.strip() else None)
            rundir.unregister(self.info.id)
            if os.environ.get("TORCHELASTIC_RUN_ID") and "PTDASH_LAUNCHER_PID" not in os.environ:
                rundir.forget_job(os.environ["TORCHELASTIC_RUN_ID"])  # a plain torchrun's pointer for its ranks
        ENGINE = None

    def abandon(self) -> None:
        """In a process forked from this engine's (a copy without its threads): take its
        hooks out, so that this process's steps are not recorded into nothing."""
        self.hooks.detach()
        self.doctor.detach()
        self._patches.undo()

    def kill(self) -> None:
        """Immediate end, from the server thread: flush what we can, then SIGKILL every rank here."""
        self.journal.event("run", "killed on request")
        if self.nodeport is not None:
            self.nodeport.kill_nodes()
        for pid in self.dist.local_pids():
            if pid != os.getpid():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.journal.set_state("crashed")
        try:
            rundir.update_info(self.run_dir, status="crashed", exit_code=-signal.SIGKILL, ended=time.time())
        except OSError:
            pass
        os.kill(os.getpid(), signal.SIGKILL)

    def on_crash(self, exc: BaseException) -> None:
        """The script raised: an out-of-memory error gets the allocator report and remedies."""
        self.doctor.on_crash(exc)
        if isinstance(exc, torch.OutOfMemoryError):
            report = system.oom_report(error=exc)
            if self.config.memory_history and self.primary:
                path = self.run_dir / "memory-snapshot.pickle"
                if system.memory_history_dump(path):
                    report["snapshot"] = str(path)
            self.journal.event(events.Oom.from_data(report), "out of memory: " + "; ".join(report["remedies"]))

    # --------------------------------------------------- moments the hooks report

    def _first_step(self) -> None:
        """Before the first update (every rank): join the command exchange if DDP is on."""
        self.stacks.here()
        self.dist.setup()
        self.flusher.floor = 0.0 if self.primary else push_interval(self.dist.world_size)  # the hub keeps up

    def _discovered(self, opt) -> None:
        """After the first step: name what was found, learn the schedule length."""
        d = self.discovery
        total = d.total_steps()
        if total is not None and self.config.steps is None:
            self.journal.total_steps = total
        names = model_names(d.models)
        self.journal.event(events.RunNote(models=tuple(names)), f"found model {', '.join(names) or 'none'}, "
                           f"{len(d.live(d.optimizers))} optimizer(s), {len(d.top_schedulers())} scheduler(s)")
        self.journal.set_state("running" if self.journal.state == "starting" else None)

    def _schedule_end(self, step: int) -> None:
        """A previewed schedule ends at ``step`` (flusher thread): the run's total, unless
        ``--steps`` or a OneCycleLR said. Sent with the next status, written with the next state."""
        if self.config.steps is None and self.discovery.total_steps() is None:
            self.journal.total_steps = step

    def _step_end(self, step: int) -> None:
        if self.journal.state == "starting":
            self.journal.set_state("running")
        if step == self.start_step + 1:
            self.checkpointer.after_first_step()
        if self.profiler.wanted:
            self.profiler.on_step_end(step)
        if self._periodic and self.checkpointer.due(step):
            self.controls.request_checkpoint("periodic")
        if self.rollback is not None:
            self.rollback.step_end(step)
        # A profile window opens only at a boundary, whose step ends here again.
        self.hooks.state.ends_wanted = self.profiler.wanted or self._periodic or self.rollback is not None

    # ------------------------------------------------------------- public API

    def log(self, values: dict, step: int | None = None) -> None:
        try:
            self.user_values.log(values, step)
        except (TypeError, ValueError) as exc:  # the script goes on; its values at the step in progress
            if str(exc) not in self._log_warned:  # once for each mistake, not every step
                self._log_warned.add(str(exc))
                self.journal.event("warning", f"ptdash.log: {exc}; the values are kept at the step in progress")
            self.user_values.log(values)

    def watch(self, model=None, optimizer=None, scheduler=None, scaler=None) -> None:
        self.discovery.watch(model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler)
        total = self.discovery.total_steps()
        if total is not None and self.config.steps is None:
            self.journal.total_steps = total
