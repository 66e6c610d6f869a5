"""Which of a run's events are told, and what a call carries: ``Notice`` and its JSON.

Pure: an Event (the store's) or a RunInfo (run.json) in, a Notice or None out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ptdash.shared import events
from ptdash.shared.config import RunInfo
from ptdash.shared.protocol import Event


@dataclass(frozen=True)
class Notice:
    """One thing to tell: its ``kind`` (one of KINDS), what happened in a line, at which step."""

    kind: str
    message: str
    step: int | None = None
    wall: float | None = None
    detail: dict = field(default_factory=dict)
    """The kind's own fields: an end's ``state`` and ``exit_code``, a rollback's ``to_step``..."""


def of_event(event: Event) -> Notice | None:
    """The notice of a stored event, None for an event nobody needs to be woken for."""
    what = events.read(event)
    step = event.step
    if isinstance(what, events.Anomaly) and what.paused:
        return Notice("pause", f"paused by an anomaly: {event.message}", step, event.wall,
                      {"layer": what.layer, "action": what.action})
    if isinstance(what, events.Rollback):
        if what.limit is not None:
            kind = "pause" if what.action == "pause" else "rollback"
            return Notice(kind, event.message, step, event.wall, {"limit": what.limit, "within": what.within,
                                                                   "action": what.action})
        if what.to_step is None:
            return None  # the LR factor lowered after a rollback: the rollback was told already
        return Notice("rollback", event.message, step, event.wall,
                      {"from_step": what.from_step, "to_step": what.to_step, "why": what.why,
                       "skipped": what.skipped})
    if isinstance(what, events.Stall) and not what.ended:
        return Notice("stall", event.message, what.step if what.step is not None else step, event.wall,
                      {"ranks": list(what.ranks), "seconds": what.seconds, "where": what.where})
    if event.kind == "restart":
        return Notice("restart", event.message, step, event.wall, dict(event.data))
    return None


def end_state(info: RunInfo) -> str:
    """``finished``, ``stopped``, ``crashed``, or ``killed`` (a crash by a signal: SIGKILL,
    the OOM killer, a kill from ptdash)."""
    code = info.exit_code
    if info.status == "crashed" and ((isinstance(code, int) and code < 0) or "killed" in (info.detail or "")):
        return "killed"
    return info.status


def of_end(info: RunInfo) -> Notice:
    """The notice of a run that ended as run.json says."""
    state = end_state(info)
    code = info.exit_code
    message = f"run {info.name} {state}" + (f" (exit {code})" if code is not None else "")
    if info.detail:
        message += f": {info.detail}"
    return Notice("end", message, info.step, info.ended, {"state": state, "exit_code": code})


def of_lost(info: RunInfo) -> Notice:
    """The notice of a run whose engine went away without saying how it ended, nor anyone for it."""
    return Notice("end", f"run {info.name} killed: the engine went away without recording its end", info.step,
                  None, {"state": "killed", "exit_code": None})


def payload(notice: Notice, info: RunInfo, count: int = 1, earlier: list[Notice] = (),
            held: dict[str, dict] | None = None) -> dict:
    """The JSON object the command reads on its stdin.

    ``text`` says it all in one line, for a chat webhook. ``count``: how many events of the
    kind this call tells (more than one when the rate limit held some back: ``earlier`` are
    those, oldest first, told in this one); ``held``: at the end of the run, the other kinds'
    events still held back, summed per kind.
    """
    summed = f" (and {count - 1} more)" if count > 1 else ""
    out = {"event": notice.kind, "run": info.name, "run_dir": info.run_dir, "message": notice.message,
           "step": notice.step, "wall": notice.wall, "count": count, **notice.detail,
           # What a chat webhook (Slack's, Mattermost's) shows of the object as it is.
           "text": f"ptdash {info.name}: {notice.kind}: {notice.message}{summed}"}
    if earlier:
        out["earlier"] = [{"message": n.message, "step": n.step, "wall": n.wall} for n in earlier]
    if held:
        out["held"] = held
    return out
