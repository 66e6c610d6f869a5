"""The dashboard's command keys: which can run now, sending a command, and the dialogs.

``CommandActions`` is the part of the app that talks back to the run: ``check_action``
hides or greys out keys whose action cannot run now, ``send`` sends a command and notes
it in the events pane (its ack follows there, through ``_apply_ack``), and the ``action_*``
methods of the control keys open the clip, LR factor, stop and quit dialogs. The app
(``app.DashboardApp``) inherits it and holds the layout and the bindings.
"""

from __future__ import annotations

from textual.widgets import TabbedContent

from ptdash.shared import names
from ptdash.shared.limits import BOUNDS
from ptdash.shared.protocol import Ack, Command

from . import hardstop
from .eventline import EventLine
from .fmt import command_text, fmt_typed
from .source import new_command_id
from .tabs import overview
from .widgets.events_pane import EventsPane
from .widgets.quit_dialog import QuitDialog
from .widgets.report_view import ReportView
from .widgets.stacks_screen import StacksScreen, stacks_screen
from .widgets.stop_dialog import StopDialog
from .widgets.value_dialog import ValueDialog

CONTROL_ACTIONS = frozenset({"pause", "resume", "checkpoint", "clip", "lr_factor", "profile", "stop", "stacks",
                             "rollback"})
"""Actions that send a command, and so need a live, connected engine."""


def keeps_snapshots(state) -> bool:
    """Whether the run keeps the rollback's snapshots (``--on-anomaly rollback`` or
    ``--rollback-every``), so that ``r`` can put the last good state back."""
    config = state.info.config if state.info is not None else None
    return config is not None and (config.on_anomaly == "rollback" or bool(config.rollback_every))


class CommandActions:
    """The command keys of ``DashboardApp``, which provides ``source``, ``state``, ``view``,
    ``comparison``, ``profile_steps`` and ``_sent`` (command id -> its text, until its ack)."""

    @property
    def run_ended(self) -> bool:
        return self.state.ended

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Hide control keys on a read-only or ended run, ``t`` with nothing compared, grey
        them out while not connected; chart keys work on the Overview, and only when they
        would change something."""
        if action in ("chart", "wide_events"):
            on_overview = self.is_mounted and self.query_one(TabbedContent).active == "overview"
            if not on_overview or overview.extent(self.state) is None:
                return False
            # Compared runs are drawn whole, by step or by time: the view does not apply.
            if parameters[:1] == ("metric",):  # more than one group of printed metrics to go through
                return not self.comparison.active and len(overview.metric_groups(self.state)) > 1
            return action == "wide_events" or not self.comparison.active and self.view.can(str(parameters[0]))
        if action not in CONTROL_ACTIONS:
            return self.comparison.active or action != "toggle_time"
        if not self.source.live or self.run_ended:
            return action == "stacks" and self.state.stacks is not None  # the ones a stall kept
        state = self.state.status.state if self.state.status is not None else "starting"
        paused = state in ("paused", "pausing")
        if (action == "pause" and paused) or (action == "resume" and not paused):
            return False
        if action == "rollback" and not keeps_snapshots(self.state):
            return False
        if not self.source.can_control or state == "stopping":
            return None
        if action == "lr_factor" and self.state.status is not None and self.state.status.lr_fixed:
            return None  # the script sets its own LR: the engine would refuse it
        return True

    def send(self, name: str, value: float | None = None, typed: str | None = None) -> None:
        """Send a command and note it in the events pane (its value as ``typed``); its ack will follow there."""
        command = Command(id=new_command_id(), name=name, value=value)
        text = command_text(name, value, typed)
        if self.source.can_control:
            self._sent[command.id] = text
            self.source.send(command)
            line = self.state.note_sent(command.id, f"{text} sent")
        else:  # the engine went away while a dialog was open
            line = self.state.note_sent(None, f"{text} not sent: the engine is not connected", "error")
        self.query_one(EventsPane).add([line])

    def action_pause(self) -> None:
        self.send("pause")

    def action_resume(self) -> None:
        self.send("resume")

    def action_checkpoint(self) -> None:
        self.send("checkpoint")

    def action_rollback(self) -> None:
        """Put the last good state back (docs/rollback.md); a paused run resumes."""
        self.send("rollback")

    def action_profile(self) -> None:
        self.state.profile_pending = f"profiling the next {self.profile_steps} steps…"
        self.state.profile_note = None
        self.send("profile", self.profile_steps)
        self.query_one("#profiler-view", ReportView).refresh_report(self.state)

    def action_stacks(self) -> None:
        """Ask every rank where it is (a live run), and show the stacks screen: the newest stacks
        until the answer (no ack: a Stacks) replaces them, or on a run that cannot be asked the
        ones a stall kept. Under DDP the Ranks tab shows them too, side by side."""
        asking = self.source.live and not self.run_ended and self.source.can_control
        if asking:
            self.source.send(Command(id=new_command_id(), name="stacks"))
        if self.state.world_size > 1:
            self.query_one(TabbedContent).active = "ranks"
        screen = stacks_screen(self)
        if screen is not None:
            screen.show(self.state.stacks, asking)
        else:
            self.push_screen(StacksScreen(self.state.stacks, asking, live=asking))

    def action_clip(self) -> None:
        status = self.state.status
        clip = status.clip if status is not None else None
        # With no override, a big change is judged against the script's own clip norm.
        script = self.state.series.get(names.CLIP_MAX)
        dialog = ValueDialog(
            "Gradient clip norm", "clip",
            f"Largest total grad norm from the next step on ({BOUNDS['clip'].text}); \"off\" gives "
            "clipping back to the script.",
            current=fmt_typed(clip) if clip is not None else "",
            reference=clip if clip is not None else script.latest() if script is not None else None)
        self.push_screen(dialog, lambda v: v is not None and self.send("clip", v.value, v.text))

    def action_lr_factor(self) -> None:
        status = self.state.status
        scale = status.lr_scale if status is not None else 1.0
        dialog = ValueDialog(
            "LR factor", "lr_scale",
            "Multiplies every param group's scheduled LR from the next step (1 = as scheduled; "
            f"{BOUNDS['lr_scale'].text}).",
            current=fmt_typed(scale), reference=scale)
        self.push_screen(dialog, lambda v: v is not None and self.send("lr_scale", v.value, v.text))

    def action_stop(self) -> None:
        self.push_screen(StopDialog(), self._stop_chosen)

    def _stop_chosen(self, choice: str | None) -> None:
        if choice is None:
            return
        self.send(choice)
        if choice == "kill":  # an engine whose Python does not run cannot take it (hardstop.py)
            self.set_timer(hardstop.KILL_WAIT_S, self._kill_unanswered)

    def _kill_unanswered(self) -> None:
        why = f"it did not end within {hardstop.KILL_WAIT_S:g} s"
        try:
            killed = hardstop.make_kill_good(self.source.run_dir, why, "the dashboard's kill")
        except (OSError, ValueError):
            return
        if killed is None:
            line = self.state.note_sent(None, "kill not taken, and the run's process is not on this machine: "
                                              "nothing killed", "error")
        elif killed:
            line = self.state.note_sent(None, f"killed from here: the engine did not take the kill ({why})", "error")
        else:
            return
        self.query_one(EventsPane).add([line])

    async def action_quit(self) -> None:
        if not self.source.live or self.run_ended:
            self.exit("closed")
        elif not self.source.can_control:
            self.exit("detach")  # not reachable now, so it cannot be stopped from here
        else:
            self.push_screen(QuitDialog(), self._quit_chosen)

    def _quit_chosen(self, choice: str | None) -> None:
        if choice == "stop":
            self.send("stop")
            self.exit("stop")
        elif choice == "detach":
            self.exit("detach")

    def _apply_ack(self, ack: Ack) -> EventLine:
        text = self._sent.pop(ack.id, None) or command_text(ack.name, None)
        line = self.state.add_ack(ack, text)
        if not ack.ok:
            self.notify(line.text, severity="error")
        return line
