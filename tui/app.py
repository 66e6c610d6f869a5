"""The dashboard app: its layout and bindings, and the source's deliveries routed into RunState.

The keys that send commands, and their dialogs, are ``commands.CommandActions``, which the
app inherits.

Build it with ``make_app(source)``; the CLI, tests and the screenshot script all do.
``app.run()`` returns what the user chose:

- ``"detach"``: leave the run training in the background,
- ``"stop"``: stop training (the stop command has been sent),
- ``"closed"``: the run had ended, or the source was read-only.
"""

from __future__ import annotations

import os
import time
from collections import deque

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.widgets import Footer, TabbedContent, TabPane

from ptdash.shared import events, names, stacks
from ptdash.shared.protocol import ENDED, Ack, Event, LayerNames, Layers, Metrics, Samples, Schedule, Stacks, Status

from .commands import CommandActions, keeps_snapshots
from .compare import Comparison
from .eventline import EventLine
from .messages import SourceUpdate
from .notify.notices import of_event
from .notify.terminal import TerminalTeller, end_notice
from .source import Backfill, Connection, History, InfoChanged, LogLines, Source
from .state import RunState
from .tabs import doctor, overview, profiler, ranks, system
from .view import ChartView
from .widgets.events_pane import EventsPane
from .widgets.header import RunHeader
from .widgets.help_screen import HelpScreen, key_rows
from .widgets.layers_view import LayersView
from .widgets.log_pane import LogPane
from .widgets.metrics_view import MetricsView
from .widgets.oom_screen import OomScreen
from .widgets.overview import CHART_BINDINGS, Overview
from .widgets.ranks_view import RanksView
from .widgets.report_view import ReportView
from .widgets.stacks_screen import stacks_screen

HISTORY_EVENTS = 200
"""Newest stored events shown in the events pane on attach."""


class DashboardApp(CommandActions, App[str]):
    """Live dashboard of one run. Use ``make_app`` to build it."""

    CSS_PATH = "app.tcss"
    TITLE = "ptdash"
    ENABLE_COMMAND_PALETTE = False
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (120, "-wide")]

    BINDINGS = [
        Binding("space", "pause", "Pause", id="pause"),
        Binding("space", "resume", "Resume", id="resume"),
        Binding("c", "checkpoint", "Checkpoint", id="checkpoint"),
        Binding("g", "clip", "Clip", id="clip"),
        Binding("l", "lr_factor", "LR factor", id="lr_factor"),
        Binding("p", "profile", "Profile", id="profile"),
        Binding("k", "stacks", "Stacks", id="stacks"),
        Binding("r", "rollback", "Roll back to the last good state", id="rollback", show=False),
        Binding("s", "stop", "Stop", id="stop"),
        Binding("q", "quit", "Quit", id="quit"),
        Binding("t", "toggle_time", "By time/step", id="compare.time"),
        Binding("question_mark", "help", "Help", key_display="?", id="help"),
        Binding("n", "terminal_notify", "Desktop notifications and bell on/off", id="terminal_notify", show=False),
        *CHART_BINDINGS,
        Binding("1", "show_tab('overview')", "Overview tab", id="tab.overview", show=False),
        Binding("2", "show_tab('layers')", "Layers tab", id="tab.layers", show=False),
        Binding("3", "show_tab('system')", "System tab", id="tab.system", show=False),
        Binding("4", "show_tab('profiler')", "Profiler tab", id="tab.profiler", show=False),
        Binding("5", "show_tab('ranks')", "Ranks tab (DDP)", id="tab.ranks", show=False),
        Binding("6", "show_tab('doctor')", "Doctor tab", id="tab.doctor", show=False),
        Binding("7", "show_tab('metrics')", "Metrics tab (every series)", id="tab.metrics", show=False),
    ]

    def __init__(self, source: Source, *, redraw_hz: float = 4.0, profile_steps: int = 5,
                 comparison: Comparison | None = None, terminal_notify: bool = True) -> None:
        super().__init__()
        self.source = source
        self.comparison = comparison or Comparison()
        self.redraw_hz = redraw_hz
        self.profile_steps = profile_steps
        self.state = RunState(info=source.info)
        self._inbox: deque[object] = deque()
        self._sent: dict[str, str] = {}
        self._last_redraw = 0.0
        self._redraw_timer = None
        self._ranks_shown = True
        self._doctor_count = 0
        self.view = ChartView()
        """How the Overview's charts are looked at (the chart keys change it)."""
        self.teller = TerminalTeller(write=self._write_terminal, run_name=source.name, in_tmux="TMUX" in os.environ,
                                     enabled=terminal_notify)
        """Tells the terminal (a desktop notification, the bell) what needs a person; ``n`` turns it off."""

    def compose(self) -> ComposeResult:
        yield RunHeader(id="header")
        with TabbedContent(id="tabs"):
            with TabPane("1 Overview", id="overview"):
                yield Overview(id="overview-view")
            with TabPane("2 Layers", id="layers"):
                yield LayersView(id="layers-view")
            with TabPane("3 System", id="system"):
                yield ReportView(system.report, system.versions, id="system-view")
            with TabPane("4 Profiler", id="profiler"):
                yield ReportView(profiler.report, profiler.versions, id="profiler-view")
            with TabPane("5 Ranks", id="ranks"):
                yield RanksView(id="ranks-view")
            with TabPane("6 Doctor", id="doctor"):
                yield ReportView(doctor.report, doctor.versions, id="doctor-view")
            with TabPane("7 Metrics", id="metrics"):
                yield MetricsView(id="metrics-view")
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.query_one(RunHeader).run_name = self.source.name
        self._show_ranks_tab()
        self.source.start(self._deliver)
        self.comparison.start(self.source.run_dir, self._deliver)

    def on_unmount(self) -> None:
        if self._redraw_timer is not None:
            self._redraw_timer.stop()  # a redraw due after the screens are gone finds nothing
            self._redraw_timer = None
        self.source.close()

    # ------------------------------------------------------------- source -> state

    def _deliver(self, obj: object) -> None:
        """Called on the source's thread: queue, and wake the app (coalesced)."""
        self._inbox.append(obj)
        self.post_message(SourceUpdate())

    def on_source_update(self, _: SourceUpdate) -> None:
        new_events: list[EventLine] = []
        log_lines: list[str] = []
        controls_changed = False
        stacks_before = self.state.stacks
        while self._inbox:
            obj = self._inbox.popleft()
            if isinstance(obj, Metrics):
                self.state.add_metrics(obj)
            elif isinstance(obj, Samples):
                self.state.add_samples(obj)
            elif isinstance(obj, Layers):
                self.state.add_layers(obj)
            elif isinstance(obj, LayerNames):
                self.state.add_layer_names(obj)
            elif isinstance(obj, Schedule):
                self.state.schedule = obj
            elif isinstance(obj, Status):
                controls_changed |= self._apply_status(obj, new_events)
            elif isinstance(obj, Ack):
                new_events.append(self._apply_ack(obj))
            elif isinstance(obj, Stacks):
                self._take_stacks(obj)
            elif isinstance(obj, Event):
                line = self.state.add_event(obj)
                if line is not None:
                    new_events.append(line)
                self._alert(obj)
            elif isinstance(obj, LogLines):
                log_lines += obj.lines
            elif isinstance(obj, History):
                controls_changed |= self._apply_history(obj, new_events)
            elif isinstance(obj, Backfill):
                self.state.add_backfill(obj)
            elif isinstance(obj, InfoChanged):
                self.state.info = obj.info
                self.state.note_info(obj.info)
                self.state.note_world_size(obj.world_size)
            elif isinstance(obj, Connection):
                self.state.connected = obj.connected
                self.state.connection_note = obj.note
                controls_changed = True
        if log_lines:
            self.query_one(LogPane).add_lines(log_lines)
        if self.state.events_changed:  # a shown line changed: an ack, a merged checkpoint
            self.state.events_changed = False
            self.query_one(EventsPane).show(self.state.events[-EventsPane.MAX_LINES:])
        elif new_events:
            self.query_one(EventsPane).add(new_events)
        if controls_changed:
            self.refresh_bindings()
        self._show_stacks(stacks_before)
        self.teller.due(time.monotonic())
        self._schedule_redraw()

    def _apply_history(self, history: History, new_events: list[EventLine]) -> bool:
        new_events += self.state.add_history(history, HISTORY_EVENTS)
        return history.status is not None and self._apply_status(history.status, new_events)

    def _apply_status(self, status: Status, new_events: list[EventLine]) -> bool:
        """Take a new status; True when the state changed (so the keys may change)."""
        old = self.state.status
        if old is not None and old.state in ENDED and status.state not in ENDED:
            return False  # a stale file read must not bring an ended run back to life
        self.state.set_status(status)
        if old is not None and old.state == status.state:
            return False
        if old is not None and status.state in ENDED:  # live: a run shown already ended tells nothing
            self.teller.offer(end_notice(status), time.monotonic())
        if status.state == "crashed":
            last = status.detail.strip().splitlines()[-1] if status.detail.strip() else "see the output pane"
            line = EventLine(time.time(), status.step, f"run crashed: {last}", "error")
            self.state.events.append(line)
            new_events.append(line)
            self.notify(last, title="Run crashed", severity="error", timeout=10)
        return True

    def _take_stacks(self, msg: Stacks) -> None:
        """Every rank's stacks, asked for with ``k``: the stacks screen shows them (and the Ranks tab, under DDP)."""
        found = tuple(stacks.read(msg.ranks))
        self.state.stacks = (f"asked for at {time.strftime('%H:%M:%S', time.localtime(msg.wall))}", found)

    def _show_stacks(self, before: object) -> None:
        """The newest stacks (an answer, or a stall's) on the stacks screen when it is open; ``k``
        offered once there are some to show, on a run that cannot be asked."""
        if self.state.stacks is before:
            return
        screen = stacks_screen(self)
        if screen is not None:
            screen.show(self.state.stacks)
        if before is None:
            self.refresh_bindings()

    def _alert(self, event: Event) -> None:
        """Live events that need the user now: an OOM report, a stall (where the ranks are), a pause for an anomaly."""
        self.teller.offer(of_event(event), time.monotonic())
        what = events.read(event)
        if isinstance(what, events.Oom) and not isinstance(self.screen, OomScreen):
            self.push_screen(OomScreen(what))
        elif isinstance(what, events.Stall) and what.where and not what.ended:
            self.notify(f"{what.where}. k shows every thread's stack.", title="Stalled", severity="warning",
                        timeout=15)
        elif isinstance(what, events.Anomaly) and what.paused:
            choices = "Space resumes, r rolls back to the last good state" if keeps_snapshots(self.state) else \
                "Space resumes"
            self.notify(f"{event.message}. {choices}.", title="Paused by an anomaly", severity="error", timeout=15)

    def _schedule_redraw(self) -> None:
        """Redraw at most ``redraw_hz`` times a second, and only when something arrived."""
        if self._redraw_timer is not None:
            return
        delay = max(0.01, self._last_redraw + 1.0 / self.redraw_hz - time.monotonic())
        self._redraw_timer = self.set_timer(delay, self._redraw)

    @property
    def drawn(self) -> bool:
        """Whether everything the source delivered so far is on screen (no delivery or redraw waits).

        Tests and the screenshot script wait for this instead of sleeping.
        """
        return not self._inbox and self._redraw_timer is None and self.comparison.loaded

    def _redraw(self) -> None:
        self._redraw_timer = None
        if not self.is_running or not self.screen_stack:
            return
        self._last_redraw = time.monotonic()
        state = self.state
        header = self.query_one(RunHeader)
        header.status = state.status
        header.steps_per_s = state.rate.rate()
        header.total_steps = state.total_steps
        header.epoch = state.epoch
        header.started = state.started_at
        header.ended = state.ended_at
        header.connection = state.connection_note
        header.pause_reason = state.pause_reason
        self.query_one(Overview).refresh_charts(state, self.view, self.comparison.runs(state), self.comparison.by_time)
        self.query_one(LayersView).refresh_layers(state.layers, names.GRAD_NORM_LOCAL in state.series,
                                                  system.kept_counts(state))
        for view in self.query(ReportView):
            view.refresh_report(state)
        self._show_ranks_tab()
        self.query_one(RanksView).refresh_ranks(state)
        self.query_one(MetricsView).refresh_metrics(state)
        if len(state.findings) != self._doctor_count:
            self._doctor_count = len(state.findings)
            badge = Text(f"({self._doctor_count})", doctor.SEVERITY_STYLES[state.findings.worst()])
            self.query_one(TabbedContent).get_tab("doctor").label = Text.assemble("6 Doctor ", badge)

    def _show_ranks_tab(self) -> None:
        """The Ranks tab is there only for a run of several ranks."""
        multi = self.state.world_size > 1
        if multi != self._ranks_shown:
            self._ranks_shown = multi
            tabs = self.query_one(TabbedContent)
            (tabs.show_tab if multi else tabs.hide_tab)("ranks")

    def action_toggle_time(self) -> None:
        self.comparison.toggle_time()
        self._schedule_redraw()

    def action_show_tab(self, tab: str) -> None:
        if tab == "ranks" and not self._ranks_shown:
            self.notify(ranks.SINGLE, timeout=4)
            return
        self.query_one(TabbedContent).active = tab

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        if event.pane.id == "layers":
            self.query_one(LayersView).focus_table()
        elif event.pane.id == "metrics":
            self.query_one(MetricsView).focus()
        self.refresh_bindings()  # the chart keys work on the Overview only

    def action_chart(self, what: str) -> None:
        """A chart key: zoom, pan, move the cursor, change the smoothing or the y scale."""
        bounds = overview.extent(self.state)
        if bounds is not None:
            self.view.apply(what, *bounds)
            self.query_one(Overview).refresh_charts(self.state, self.view)
            self.refresh_bindings()

    def _write_terminal(self, text: str) -> None:
        if self._driver is not None:
            self._driver.write(text)

    def action_terminal_notify(self) -> None:
        self.teller.enabled = not self.teller.enabled
        self.notify(f"desktop notifications and the bell {'on' if self.teller.enabled else 'off'}", timeout=3)

    def on_metrics_view_pin(self, message: MetricsView.Pin) -> None:
        self.view.pinned = message.name
        self.query_one(Overview).refresh_charts(self.state, self.view)

    def action_wide_events(self) -> None:
        self.query_one(Overview).toggle_wide_events()

    def action_help(self) -> None:
        active = self.query_one(TabbedContent).active
        self.push_screen(HelpScreen(help_rows(self.check_action, active == "layers", active == "metrics")))


def help_rows(check, on_layers: bool, on_metrics: bool = False) -> list[tuple[str, str, bool]]:
    """The help screen's rows, (key, description, available now): the app's keys, available as
    ``check`` (``check_action``) says, then the Layers tab's, available ``on_layers``, then the
    Metrics tab's, available ``on_metrics``. The README's keys table is held to these
    (tests/unit/test_docs.py)."""
    rows = key_rows(DashboardApp.BINDINGS, check)
    rows += [(b.key_display or b.key, b.description, on_layers) for b in LayersView.BINDINGS]
    rows.append(("enter", "Chart the layer's history", on_layers))
    rows += [(b.key_display or b.key, b.description, on_metrics) for b in MetricsView.BINDINGS]
    return rows


def make_app(source: Source, **options) -> DashboardApp:
    """The dashboard for ``source`` (LiveSource or ReplaySource).

    Options: ``redraw_hz`` (chart redraws per second, default 4), ``profile_steps``
    (steps the ``p`` key profiles, default 5), ``comparison`` (runs drawn beside it),
    ``terminal_notify`` (desktop notifications and the bell, default on).
    """
    return DashboardApp(source, **options)
