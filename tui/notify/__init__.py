"""``--notify CMD``: the events that need a person, told to a command of the user's.

The notifier is a process of its own (``python -m ptdash.tui.notify RUN_DIR ...``), started
by ``ptdash`` beside the engine in a session of its own, reading the run as any reader does
(run.json and the store). Why not a thread of the engine's: an engine killed by SIGKILL, the
OOM killer or a segfault cannot say it ended, and a command that hangs (a mail server that
does not answer) must not share a process with training. Why not the dashboard: a run
detached, or headless under a batch scheduler, has none. The notifier ends with the run.

``notices`` says which events are told and what each carries, ``limiter`` holds the rate to
one call a kind a minute, ``command`` runs the user's command, ``watcher`` is the loop.
"""

from __future__ import annotations

KINDS = ("end", "pause", "rollback", "stall", "restart")
"""What can be told: the end of the run (finished, stopped, crashed, killed), a pause on an
anomaly (or on too many rollbacks), a rollback, a stall, a restart of the job."""
