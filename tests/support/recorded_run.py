"""Fixtures for the dashboard tests: a realistic recorded run, and a real in-process server.

``make_run`` writes a run dir the way the engine would (run.json, token, metrics.db via
StoreWriter, events, output.log) holding a demo-like run: loss decaying with noise, a
OneCycle LR over two param groups, grad norms under a clip line. ``FakeEngine`` serves
that run's control socket with the real ``transport.Server``: it records the commands
it receives and answers them with Ack and Status as the engine would. ``make_ddp_run``
adds the rows of more ranks (one of them slow) and the doctor's findings.
"""

from __future__ import annotations

import math
import random
import threading
import time
from dataclasses import replace
from pathlib import Path

from ptdash.shared import events, rundir
from ptdash.shared.config import RunInfo
from ptdash.shared.names import printed as printed_series
from ptdash.shared.protocol import Ack, Command, Event, LayerNames, Layers, Metrics, Schedule, Status, Welcome
from ptdash.shared.store import STORE_NAME, StoreWriter
from ptdash.shared.transport import Server

TOTAL_STEPS = 2000
CLIP = 1.0

LAYER_COUNT = 500
"""Parameters of the fixture's layer records: a 41-block transformer's worth."""

VANISHING, EXPLODING = 7, 13
"""Indices of the parameters the layer records flag (EXPLODING only from step 400 on)."""


def layer_names(count: int = LAYER_COUNT) -> list[str]:
    """Parameter names of a GPT-like model, cut to ``count``."""
    names = ["tok_emb.weight", "pos_emb.weight"]
    block = ["ln1.weight", "ln1.bias", "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight", "attn.proj.bias",
             "ln2.weight", "ln2.bias", "mlp.fc.weight", "mlp.fc.bias", "mlp.proj.weight", "mlp.proj.bias"]
    b = 0
    while len(names) < count - 3:
        names += [f"blocks.{b}.{p}" for p in block]
        b += 1
    names = names[:count - 3] + ["ln_f.weight", "ln_f.bias", "head.weight"]
    return names[:count]


def layer_shapes(names: list[str]) -> list[list[int]]:
    return [[768] if n.endswith("bias") or ".ln" in n or n.startswith("ln") else [768, 768] for n in names]


def layer_record(step: int, count: int = LAYER_COUNT) -> tuple[list, list | None, dict]:
    """(grad_norms, update_ratios or None, flags) of one flush at ``step``: deterministic."""
    norms: list[float | None] = []
    for i in range(count):
        base = 10 ** (-3 + 3 * ((i * 37) % 100) / 100)
        norms.append(base * (1 + 0.2 * math.sin(step / 5 + i)))
    flags = {str(VANISHING): "vanishing"}
    norms[VANISHING] = 1e-9
    if step >= 400:
        norms[EXPLODING] = 500.0 + step
        flags[str(EXPLODING)] = "exploding"
    ratios = [1e-3 * (1 + (i % 10)) for i in range(count)] if step % 20 == 0 else None
    return norms, ratios, flags


def onecycle_lr(step: int, total: int = TOTAL_STEPS, peak: float = 3e-3) -> float:
    """OneCycle-like: linear warm-up over 10%, cosine down to peak/1000."""
    warm = total // 10
    if step < warm:
        return peak * (0.04 + 0.96 * step / warm)
    t = (step - warm) / max(1, total - warm)
    return peak / 1000 + (peak - peak / 1000) * (1 + math.cos(math.pi * t)) / 2


def demo_row(step: int, rng: random.Random, wall: float) -> list:
    """One optimizer step of the demo run: ``[step, wall, {name: value}]``."""
    loss = 2.3 * math.exp(-step / 180) + 0.12 + rng.gauss(0, 0.04) * (1 + math.exp(-step / 180))
    norm = 0.4 + 2.5 * math.exp(-step / 120) + abs(rng.gauss(0, 0.15))
    if step == 321:
        norm = 7.5  # one spike the charts must keep
    lr = onecycle_lr(step)
    step_s = 0.05 + abs(rng.gauss(0, 0.004))
    return [step, wall, {
        "loss": max(0.01, loss),
        "loss/micro_batches": 1.0,
        "opt/lr/group0": lr,
        "opt/lr/group1": lr / 10,
        "grad/norm_total": norm,
        "grad/clip_max": CLIP,
        "grad/clipped": 1.0 if norm > CLIP else 0.0,
        "time/step_s": step_s,
        "throughput/samples_per_s": 64 / step_s,
        **({"user/val_loss": max(0.01, loss) * 1.1} if step % 50 == 0 else {}),
    }]


def host_sample(wall: float, rng: random.Random, rss: float = 1.2e9) -> list:
    """One reading of the host, as the engine takes once a second: ``[wall, {name: value}]``."""
    return [wall, {"host/cpu_pct": 50.0 + rng.random() * 10, "host/proc_cpu_pct": 95.0 + rng.random() * 5,
                   "host/mem_used_bytes": 9.5e9 + rss, "host/mem_total_bytes": 24e9, "host/rss_bytes": rss,
                   # ptdash's own cost, as the engine measures it (budget.py)
                   "ptdash/step_pct": 0.4, "ptdash/threads_pct": 0.8, "ptdash/budget_pct": 1.0,
                   "ptdash/layers_every": 1.0, "ptdash/doctor_every": 16.0}]


def schedule_ahead(step: int, total: int = TOTAL_STEPS) -> Schedule:
    """The Schedule the engine would send at ``step`` of the demo run: its OneCycle LR to the end."""
    steps = list(range(step + 1, total + 1, 8)) + [total]
    return Schedule(step=step, steps=steps, lrs=[[onecycle_lr(s) for s in steps], [onecycle_lr(s) / 10 for s in steps]],
                    end=total)


def run_start(steps: int, now: float | None) -> float:
    """The wall time a recorded run of ``steps`` started, for it to end 3 s before ``now`` (default: now)."""
    return (time.time() if now is None else now) - steps * 0.05 - 5


def make_run(root: Path, steps: int = 500, status: str = "running", name: str = "demo",
             exit_code: int | None = None, seed: int = 0, layers: int = 0, extra_events=(),
             now: float | None = None, schedule: bool = False, printed: bool = False) -> Path:
    """A run dir holding ``steps`` recorded steps of the demo run, in state ``status``.

    With ``schedule``, the store also holds the LR schedule ahead as computed at the last step.
    With ``printed``, what the demo would print every 50 steps is there too, as the engine
    stores it (``printed/val_loss``, ``printed/val_acc``, ``printed/test_bleu``).

    With ``layers``, every 4th step also stores a per-parameter record of that many
    parameters, as the engine's flush does (names only in the first). Every wall time
    is counted back from ``now``: a fixed one makes the run the same on every call
    (snapshot tests), the default makes it recent (a live run's elapsed time and rate).
    """
    run_dir = rundir.create(Path(root), name, argv=["demo.py", "--lr", "3e-3"])
    rng = random.Random(seed)
    start = run_start(steps, now)
    rows = [demo_row(s, rng, start + 2 + s * 0.05) for s in range(1, steps + 1)]
    writer = StoreWriter(run_dir / STORE_NAME)
    writer.set_meta(config={"script": "demo.py"})
    for i in range(0, len(rows), 100):
        writer.write(rows=rows[i:i + 100])
    if printed:
        for s in range(50, steps + 1, 50):
            loss = rows[s - 1][2]["loss"]
            found = {"val_loss": round(loss * 1.08 + 0.05, 4), "val_acc": round(min(0.97, 0.3 + s / 800), 4),
                     "test_bleu": round(2 + s / 40 + rng.random(), 3)}
            line = f"eval {s}: val_loss {found['val_loss']} val_acc {found['val_acc']} bleu {found['test_bleu']}"
            # Each name's first value is an event, as the engine journals it (printed.py).
            writer.write(rows=[[s, rows[s - 1][1], {printed_series(n): v for n, v in found.items()}]],
                         events=[Event(kind="printed", step=s, wall=rows[s - 1][1],
                                       message=f"found printed metric {n} = {v} at step {s}: {line}",
                                       data={"name": n, "series": printed_series(n), "value": v, "line": line})
                                 for n, v in found.items()] if s == 50 else [])
    seconds = int(steps * 0.05) + 1
    writer.write(samples=[host_sample(start + 2 + s, rng) for s in range(seconds)])
    if layers:
        names = layer_names(layers)
        records = [LayerNames(step=4, names=names, shapes=layer_shapes(names))]
        for step in range(4, steps + 1, 4):
            norms, ratios, flags = layer_record(step, layers)
            records.append(Layers(step=step, grad_norms=norms, update_ratios=ratios, flags=flags))
        for i in range(0, len(records), 50):
            writer.write(layers=records[i:i + 50])
    if schedule:
        writer.write(layers=[schedule_ahead(steps)])
    writer.write(events=[
        Event(kind="run", step=0, wall=start + 1, message="started"),
        Event(kind="checkpoint", step=100, wall=start + 2 + 100 * 0.05, message="saved checkpoints/step-100.pt",
              data={"path": "checkpoints/step-100.pt"}),
        Event(kind="anomaly", step=321, wall=start + 2 + 321 * 0.05, message="grad norm spike 7.5 (12x median)"),
        *extra_events,
    ])
    writer.close()
    log = [f"epoch 0 step {s} loss {r[2]['loss']:.4f}" for s, r in zip(range(1, steps + 1), rows) if s % 50 == 0]
    (run_dir / "output.log").write_text("loading data...\n" + "\n".join(log) + "\n")
    changes = dict(status=status, pid=None, started=start, step=steps, total_steps=TOTAL_STEPS)
    if exit_code is not None:
        changes.update(exit_code=exit_code, ended=start + 2 + steps * 0.05)
    rundir.update_info(run_dir, **changes)
    return run_dir


def run_info(**fields) -> RunInfo:
    """A run.json for tests of what reads one: made-up identity, the rest as given."""
    return RunInfo(id="r1", name="demo", run_dir="/runs/demo", socket="/runs/demo.sock", **fields)


PROFILE_TOP = [
    {"name": "aten::addmm", "calls": 30, "self_ms": 12.5, "total_ms": 14.0, "self_device_ms": 0.0,
     "total_device_ms": 0.0, "cpu_mem_bytes": 3 * 2 ** 20, "device_mem_bytes": 0},
    {"name": "aten::gelu_backward", "calls": 10, "self_ms": 4.25, "total_ms": 4.25, "self_device_ms": 0.0,
     "total_device_ms": 0.0, "cpu_mem_bytes": 0, "device_mem_bytes": 0},
]
"""The top ops of a CPU profile report, as the engine's ``profile`` event carries them."""


RANK_LOSS = 100.0
"""Ranks above 0 record a loss near this, so a rank's rows in rank 0's charts would show."""

FINDINGS = (
    ("grads-never-cleared", "gradients are never cleared: .grad of all 4 parameters keeps growing",
     "backward() adds to .grad instead of replacing it", "call optimizer.zero_grad() once per step", "error"),
    ("input-bound", "62% of each step waits for data (DataLoader num_workers=0)",
     "the training loop itself loads and collates every batch", "set num_workers=4", "warning"),
)
"""(id, what, why, fix, severity) of the findings ``make_ddp_run`` stores, oldest first."""


def finding_event(rule: str, what: str, why: str, fix: str, severity: str, step: int, wall: float,
                  rank: int = 0) -> Event:
    """A stored ``finding`` event as the engine writes it."""
    return Event(kind="finding", step=step, wall=wall, message=f"{rule}: {what}", rank=rank,
                 data={"id": rule, "what": what, "why": why, "fix": fix, "severity": severity, "step": step,
                       "source": "train.py:42"})


def rank_row(step: int, rank: int, rng: random.Random, wall: float, slow: float = 1.0) -> list:
    """One step of rank ``rank``: its own loss near RANK_LOSS and timings ``slow`` times rank 0's."""
    step_s = (0.05 + abs(rng.gauss(0, 0.002))) * slow
    return [step, wall, {
        "loss": RANK_LOSS + rank + rng.random(),
        "time/step_s": step_s,
        "time/data_s": 0.25 * step_s,
        "time/compute_s": 0.6 * step_s,
        "time/optim_s": 0.15 * step_s,
        "throughput/samples_per_s": 64 / step_s,
        "grad/norm_total": 1.0,
    }]


def make_ddp_run(root: Path, steps: int = 200, world_size: int = 2, slow_rank: int = 1, slow: float = 2.0,
                 status: str = "running", findings: bool = True, exit_code: int | None = None,
                 now: float | None = None, **info) -> Path:
    """``make_run`` with ``world_size`` ranks: rows of ranks 1.. (``slow_rank`` ``slow`` times slower).

    With ``findings``, the store also holds FINDINGS (the first raised by rank 0 and by
    rank 1); ``info`` goes into run.json (``rank_failures``, ``detail``).
    """
    start = run_start(steps, now)
    events = []
    if findings:
        for i, finding in enumerate(FINDINGS):
            events.append(finding_event(*finding, 20 + i * 30, start + 3 + i))
        events.append(finding_event(*FINDINGS[0], 20, start + 3, rank=1))
    run_dir = make_run(root, steps=steps, status=status, exit_code=exit_code, extra_events=events, now=now)
    writer = StoreWriter(run_dir / STORE_NAME)
    for rank in range(1, world_size):
        rng = random.Random(rank)
        factor = slow if rank == slow_rank else 1.0
        writer.write(rows=[rank_row(s, rank, rng, start + 2 + s * 0.05, factor) for s in range(1, steps + 1)],
                     rank=rank)
        writer.write(samples=[host_sample(start + 2 + s, rng, 1.0e9 + rank * 1e8)
                              for s in range(int(steps * 0.05 * factor) + 1)], rank=rank)
    writer.close()
    rundir.update_info(run_dir, world_size=world_size, **info)
    return run_dir


class FakeEngine:
    """The engine's side of the control socket, backed by the real ``transport.Server``.

    Commands are applied at once at the current step: pause/resume/clip/lr_scale change
    the published Status; a clip of a negative value (which the dashboard must never
    send) is refused like the real engine does.
    """

    def __init__(self, run_dir: Path, step: int = 500, world_size: int = 1, layer_names: LayerNames | None = None) -> None:
        self.run_dir = Path(run_dir)
        info = rundir.read_info(run_dir)
        self.commands: list[Command] = []
        self.status = Status(state="running", step=step, total_steps=TOTAL_STEPS)
        self._lock = threading.Lock()
        self._rng = random.Random(1)
        welcome = Welcome(run_id=info.id, run_dir=str(run_dir), pid=0, world_size=world_size)
        self.server = Server(Path(info.socket), rundir.read_token(run_dir), welcome,
                             on_command=self._on_command,
                             on_connect=lambda: [self.status] + ([layer_names] if layer_names else []))

    def __enter__(self) -> FakeEngine:
        self.server.start()
        return self

    def __exit__(self, *_) -> None:
        self.server.stop()

    def wait_for_client(self, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while self.server.client_count == 0:
            if time.monotonic() > deadline:
                raise TimeoutError("no dashboard connected")
            time.sleep(0.02)

    def names(self) -> list[tuple[str, float | None]]:
        with self._lock:
            return [(c.name, c.value) for c in self.commands]

    def set_status(self, **changes) -> None:
        with self._lock:
            self.status = replace(self.status, **changes)
        self.server.publish(self.status)

    def step(self, n: int = 1) -> None:
        """Publish ``n`` more steps as live metrics."""
        rows = []
        for _ in range(n):
            s = self.status.step + 1
            rows.append(demo_row(s, self._rng, time.time()))
            self.status = replace(self.status, step=s)
        self.server.publish(Metrics(rows=rows))
        self.server.publish(self.status)

    def layers(self, count: int = LAYER_COUNT, names: bool = False) -> None:
        """Publish one live per-parameter record at the current step (after its names when asked)."""
        norms, ratios, flags = layer_record(self.status.step, count)
        if names:
            listed = layer_names(count)
            self.server.publish(LayerNames(step=self.status.step, names=listed, shapes=layer_shapes(listed)))
        self.server.publish(Layers(step=self.status.step, grad_norms=norms, update_ratios=ratios, flags=flags))

    def event(self, what: events.EventData | str, message: str) -> None:
        """Publish an engine event at the current step, as the journal builds it (events.py)."""
        kind, data = (what, {}) if isinstance(what, str) else events.encode(what)
        self.server.publish(Event(kind=kind, step=self.status.step, wall=time.time(), message=message, data=data))

    def _on_command(self, cmd: Command) -> None:
        with self._lock:
            self.commands.append(cmd)
            step = self.status.step
            changes: dict = {}
            ok, message = True, ""
            if cmd.name == "pause":
                changes = dict(state="paused", paused_at=step)
            elif cmd.name == "resume":
                changes = dict(state="running", paused_at=None)
            elif cmd.name == "clip":
                if cmd.value is not None and cmd.value <= 0:
                    ok, message = False, "clip norm must be > 0"
                else:
                    changes = dict(clip=cmd.value)
            elif cmd.name == "lr_scale":
                changes = dict(lr_scale=cmd.value)
            elif cmd.name == "stop":
                changes = dict(state="stopping")
            elif cmd.name == "profile":
                message = f"profiling steps {step + 1}-{step + int(cmd.value or 0)}"
            if changes:
                self.status = replace(self.status, **changes)
            status = self.status
        self.server.publish(Ack(id=cmd.id, name=cmd.name, ok=ok, step=step, message=message))
        if ok:
            self.server.publish(Event(kind="command", step=step, wall=time.time(),
                                      message=f"{cmd.name} applied", data={"id": cmd.id}))
        self.server.publish(status)
