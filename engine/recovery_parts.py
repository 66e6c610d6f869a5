"""The recovery parts of a run, built together: the one judge, what is done about a bad
step (anomalies.py), and the rollback (rollback.py, only when the run keeps snapshots)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .anomalies import Anomalies
from .discovery import param_names
from .judge import Judge
from .rollback import Rollback


@dataclass(frozen=True)
class Recovery:
    """A run's judge, anomaly handler and rollback part (None: no snapshot is kept)."""

    judge: Judge
    anomalies: Anomalies
    rollback: Rollback | None


def build(*, config, leads: bool, journal, controls, settings, discovery, dist, state: Callable) -> Recovery:
    """The parts for ``config``: ``leads`` (rank 0) judges spikes (every rank does when the
    ranks vote on a rollback); ``state()`` is the step boundary's shared state (stepstate.py),
    told the loss limit and read for the step's time and its ended losses."""
    judge = Judge(limit_to=lambda limit: setattr(state(), "loss_max", limit), step_now=lambda: state().step,
                  spikes=leads or config.on_anomaly == "rollback")
    rollback = None
    if Rollback.wanted_by(config):
        rollback = Rollback(config=config, discovery=discovery, journal=journal, settings=settings,
                            submit=controls.submit, dist=dist, judge=judge, unattended=config.pause_timeout is not None,
                            step_seconds=lambda: state().last_step_s, ended_losses=lambda: state().ended_losses)
    anomalies = Anomalies(event=journal.event, action=config.on_anomaly, pause_here=controls.pause_here,
                          request_pause=controls.submit,
                          is_paused=lambda: controls.paused or controls.requested_pause,
                          names=lambda params: param_names(discovery.models, params), judge=judge,
                          multi=lambda: dist.multi, rollback=lambda: rollback)
    return Recovery(judge=judge, anomalies=anomalies, rollback=rollback)
