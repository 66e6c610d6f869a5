"""What the headless front says as a run goes, read from its store and run.json: events
worth a line, a pause and the commands that answer it, and the progress line."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from ptdash.shared import events, names, rundir
from ptdash.shared.config import RunInfo
from ptdash.shared.protocol import ENDED, Event
from ptdash.shared.reader import StoreReader, wait_for_store
from ptdash.shared.store import STORE_NAME

from .fmt import eta, fmt_duration
from .incidents import Incidents
from .series import StepRate

SHOWN_KINDS = ("anomaly", "warning", "store", "disk", "oom", "stall", "node", "doctor", "rollback", "snapshot")
"""Events printed as they happen."""
ATTENTION_S = 60.0
"""Seconds the progress line's ``last:`` names an event that asks for attention, unless a newer one comes."""
SLOW_RATE = 0.5
"""Below this many steps per second, the line shows seconds per step instead."""
EXPLAIN_WAIT = 10.0
"""Seconds a pause waits for the store to say why before it is said without."""


class Watcher:
    """Reads the store and run.json as the run goes: events worth a line, a pause and how
    to answer it, and the progress line when it is due."""

    def __init__(self, run_dir: Path, pause_timeout: float | None, linked: bool, say: Callable[[str], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.run_dir, self.pause_timeout, self.linked, self.say = run_dir, pause_timeout, linked, say
        self.clock = clock
        """Seconds, for how long ``last`` is named (time.monotonic; a test's own clock)."""
        self.reader: StoreReader | None = None
        self.after_id = 0
        self.paused_said: int | None = None
        self._last: tuple[Event, float] | None = None
        """The newest event that asks for attention, and when this front read it."""
        self.disk_full = False
        """Whether the engine named a full disk: the store may then lag behind the run."""
        self._shown_step: int | None = None
        self.unsaid_pause: Event | None = None
        self.said_pauses: set[int | None] = set()
        self.cause: Event | None = None
        """What paused the run (an anomaly, too many rollbacks) since the last resume; None: a request."""
        self.explained: set[int] = set()
        """The steps whose pause the store explains: run.json says a pause before the store does."""
        self.pause_seen: float | None = None

    def poll(self, progress: bool, final: bool = False) -> None:
        try:
            info = rundir.read_info(self.run_dir)
        except (OSError, ValueError):
            return
        if not (progress or info.status == "paused" or final):
            return
        self.reader = self.reader or wait_for_store(self.run_dir / STORE_NAME, 0)
        if self.reader is None:
            return
        for ev in self.reader.events(after_id=self.after_id):
            self.after_id = max(self.after_id, ev.id or 0)
            what = events.read(ev)
            # A linked front has the disk notices from the link already, as they happened.
            if asks_attention(ev, what) and not (ev.kind == "disk" and self.linked):
                self._last = (ev, self.clock())
            shown = ev.kind in SHOWN_KINDS or (ev.kind == "run" and "stopping" in ev.message)
            paused = isinstance(what, events.Anomaly) and what.paused
            self._explain(ev, what)
            if paused and info.status == "paused":
                shown = False  # the pause's own lines say it
            if shown and not (ev.kind == "disk" and self.linked):
                self.say(f"[ptdash] {ev.kind} at step {ev.step}: {ev.message}")
            if paused and ev.step not in self.said_pauses:
                self.unsaid_pause = ev
        if info.status == "paused" and self.paused_said != info.paused_at and not final:
            # run.json says a pause before the store says why: wait for the why, a while.
            self.pause_seen = self.pause_seen or time.monotonic()
            known = info.paused_at in self.explained
            if known or time.monotonic() - self.pause_seen > EXPLAIN_WAIT:
                self.paused_said, self.pause_seen = info.paused_at, None
                self.said_pauses.add(info.paused_at)
                self.unsaid_pause = None
                self.say(pause_text(self.run_dir.resolve(), info, self.cause, self.pause_timeout, known))
        elif info.status != "paused":
            self.paused_said = self.pause_seen = None
        if final and self.unsaid_pause is not None:  # a pause this front was too busy to see
            ev, self.unsaid_pause = self.unsaid_pause, None
            self.say(f"[ptdash] paused after step {ev.step}: {ev.message}")
        if progress and not final and info.status not in ENDED:  # an ended run's line is the final one, said once
            line = progress_line(self.reader, info, self.last)
            step = self.reader.latest()[0]
            if self.disk_full and step is not None and step == self._shown_step and info.status == "running":
                line += " | (the disk is full: the stored history lags behind the run)"
            self._shown_step = step
            self.say(line)

    @property
    def last(self) -> Event | None:
        """What the progress line's ``last:`` names: the newest event that asks for attention,
        for ATTENTION_S after it was read; None after that, or when none came."""
        if self._last is None:
            return None
        event, seen = self._last
        return event if self.clock() - seen < ATTENTION_S else None

    def _explain(self, ev: Event, what) -> None:
        """Follow what the events say of pauses: their causes, and which steps paused."""
        if isinstance(what, events.Anomaly) and what.paused or isinstance(what, events.Rollback) \
                and what.action == "pause":
            self.cause = ev
            if isinstance(what, events.Anomaly) and what.step == (ev.step or 0) + 1:
                self.explained.add(ev.step)  # paused on the training thread, before the update
        elif isinstance(what, events.CommandAnswer) and what.ok and what.applied_step is not None:
            if what.name == "pause":
                self.explained.add(what.applied_step)
            elif what.name == "resume":
                self.cause = None


def asks_attention(event: Event, what: events.EventData) -> bool:
    """Whether ``event`` asks a person for attention (the progress line's ``last:``): an anomaly,
    a rollback, an out-of-memory, a stall under way, a full disk or a store that cannot keep up,
    a node lost, a warning that is ptdash's own (the script's Python warnings are in its
    output already), a doctor's finding of a warning or worse. Never informational notes: a
    printed metric found, a checkpoint, a command's answer, a snapshot, a change of sampling."""
    kind = event.kind
    if kind in ("anomaly", "rollback", "oom", "disk", "store"):
        return not (isinstance(what, events.Rollback) and what.lr_scale is not None and what.to_step is None
                    and what.limit is None)  # the LR factor back after a rollback: a note
    if isinstance(what, events.Stall):
        return not what.ended
    if isinstance(what, events.Node):
        return what.lost
    if isinstance(what, events.Warned):
        return what.origin != "python"
    if isinstance(what, events.Finding):
        return what.severity != "info"  # an engine that gave none: a warning (findings.py)
    return False


def anomalies_said(reader: StoreReader, run_dir: Path) -> str:
    """`` | 2 anomalies: ptdash show RUN --once lists them`` for the final line; empty without any."""
    folded = Incidents()
    for event in reader.events(kind="anomaly") + reader.events(kind="rollback"):
        folded.add(event)
    n = len(folded)
    return f" | {n} anomal{'y' if n == 1 else 'ies'}: ptdash show {run_dir} --once lists them" if n else ""


def pause_text(run_dir: Path, info: RunInfo, why: Event | None, timeout: float | None, known: bool = True) -> str:
    """What a pause needs from a person, in plain lines: what, where, and the commands.
    ``why`` is what paused it, None for a request, or not ``known`` yet."""
    reason = why.message if why is not None else "paused on request" if known else "paused (the store does not say why yet)"
    what = events.read(why) if why is not None else None
    layer = what.layer if isinstance(what, events.Anomaly) else None
    lines = [f"[ptdash] paused after step {info.paused_at}: {reason}"]
    if layer:
        lines.append(f"[ptdash]   layer: {layer}")
    before = isinstance(what, events.Anomaly) and not what.applied  # paused before the bad update
    resume = "resume (the bad update is skipped)" if before else "resume (the bad update was applied)" \
        if isinstance(what, events.Anomaly) else "resume"
    lines += [f"[ptdash]   {resume}:  ptdash ctl {run_dir} resume",
              f"[ptdash]   stop, with a checkpoint:  ptdash ctl {run_dir} stop",
              "[ptdash]   skip such updates without pausing next time:  ptdash --on-anomaly skip ...",
              "[ptdash]   or roll back to the last good state next time:  ptdash --on-anomaly rollback ..."]
    if info.config.on_anomaly == "rollback" or info.config.rollback_every:
        lines.insert(2 + bool(layer), f"[ptdash]   roll back to the last good state and go on:  ptdash ctl {run_dir} rollback")
    if timeout:
        lines.append(f"[ptdash]   nobody resuming: it stops by itself after {fmt_duration(timeout)} paused "
                     "(--pause-timeout)")
    return "\n".join(lines)


def progress_line(reader: StoreReader, info: RunInfo, last: Event | None = None, status: bool = True) -> str:
    """``[ptdash] running | step 1200/2000 | loss 2.3456 | lr 3.00e-04 | val_loss 2.29 @1000 | 12.3 steps/s |
    ETA 1m05s | last: ...``: the validation metric is the newest the script printed (printed.py).
    Without ``status`` the line leaves the run's state out (the final line says it first, once).

    The rate leaves out the time the run was paused; below SLOW_RATE steps a second it is
    seconds per step. The total is run.json's, else the end of the stored LR schedule.
    """
    step, values = reader.latest()
    if step is None:
        return f"[ptdash] {info.status + ': ' if status else ''}no step yet" + (
            f" | last: {_short(last.message)}" if last else "")
    schedule = reader.schedule()
    total = info.total_steps or info.config.steps or (schedule.end if schedule is not None else None)
    # A store that lags (a full disk) has older values than run.json's step: say both.
    newest = info.step if isinstance(info.step, int) and info.step > step else step
    parts = [info.status] if status else []
    parts.append(f"step {newest}/{total}" if total else f"step {newest}")
    if newest > step:
        parts.append(f"history stored to step {step}")
    loss, lr, norm = values.get(names.LOSS), values.get(names.lr(0, 0)), values.get(names.GRAD_NORM)
    if loss is not None:
        parts.append(f"loss {loss:.4f}")
    if lr is not None:
        parts.append(f"lr {lr:.2e}")
    if norm is not None:
        parts.append(f"grad norm {norm:.3g}")
    elif names.GRAD_NORM not in values:  # a step the cost budget did not sample: the newest norm, and its step
        at, norm = reader.newest([names.GRAD_NORM]).get(names.GRAD_NORM, (None, None))
        if at is not None:
            parts.append(f"grad norm {'non-finite' if norm is None else f'{norm:.3g}'} @{at}")
    held_out = [n for n in reader.names() if (p := names.parse_printed(n)) is not None and names.held_out(p)]
    if held_out:  # the newest validation metric the script printed: "val_loss 2.2921 @200"
        name, (at, value) = max(reader.newest(held_out).items(), key=lambda item: (item[1][0], item[0]),
                                default=(None, (None, None)))
        if name is not None:
            shown = "non-finite" if value is None else f"{value:.5g}"
            parts.append(f"{names.parse_printed(name)} {shown} @{at}")
    rate = StepRate(window_s=float("inf"))
    for s, wall in zip(*reader.walls(after_step=step - 50)):
        rate.add(s, wall)
    for event in reader.events(kind="command"):
        answer = events.read(event)
        if isinstance(answer, events.CommandAnswer) and answer.ok and answer.name in ("pause", "resume"):
            (rate.pause if answer.name == "pause" else rate.resume)(event.wall)
    per_s = rate.rate()
    if per_s is not None:
        parts.append(f"{per_s:.1f} steps/s" if per_s >= SLOW_RATE else f"{1 / per_s:.1f} s/step")
        left = eta(step, total, per_s)
        if left is not None and info.status == "running":
            parts.append(f"ETA {fmt_duration(left)}")
    if last is not None:
        parts.append(f"last: {_short(last.message)}")
    return "[ptdash] " + " | ".join(parts)


def _short(text: str, width: int = 72) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= width else line[:width - 1] + "…"
