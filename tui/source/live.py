"""A running engine over its control socket: ``LiveSource``.

It loads history from the run dir, connects (retrying while the engine starts), relays
the socket without the rows the history already holds, reads back from the store what
the live stream dropped, and once the engine is gone follows run.json and the store
until the run's final status is known.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import replace
from pathlib import Path

from ptdash.shared import rundir
from ptdash.shared.client import Client
from ptdash.shared.config import RunInfo
from ptdash.shared.protocol import (
    ENDED,
    Ack,
    Command,
    Event,
    LayerNames,
    Layers,
    Metrics,
    Samples,
    Schedule,
    Stacks,
    Status,
    TransportError,
)
from ptdash.shared.reader import StoreReader
from ptdash.shared.store import STORE_NAME, StoreError

from . import Backfill, Connection, InfoChanged, LogLines, Post, Source, read_run_info
from .history import HISTORY_POINTS, load_history, load_ranks, load_samples, load_series, status_from_files, world_size
from .logtail import LogTail

GONE_GRACE_S = 3.0
"""Seconds a dead engine process may leave run.json unfinished before the run counts as crashed."""

LAUNCHER_WAIT_S = 30.0
"""Longest a source follows an ended run's files while its launcher still runs (to read failed ranks)."""

POLL_S = 0.5
"""How often the source thread looks at output.log and run.json between messages."""


class LiveSource(Source):
    """A running engine over its control socket, with history and output.log from the run dir.

    Connects (retrying while the engine is still starting), loads history, then follows
    the socket. When the engine goes away it keeps following run.json and the store
    until the run's final status is known.
    """

    live = True

    CONNECT_WAIT_S = 30.0
    """How long to keep trying to connect while run.json says the run is starting."""

    def __init__(self, run_dir: Path | str, client_name: str = "dashboard") -> None:
        super().__init__(run_dir)
        self.client_name = client_name
        self._client: Client | None = None
        self._outbox: queue.Queue[Command | None] = queue.Queue()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._last: dict[str, int] = {}
        self._last_wall_step = -1
        self._gaps: list[tuple[int, int, float]] = []
        self._pending: list[str] = []
        self._last_event_id = 0
        self._backfilled_events: set[tuple[float, str]] = set()
        self._rank_last: dict[tuple[int, str], int] = {}
        self._sampled: dict[int, float] = {}
        """Rank -> the newest reading's wall time the dashboard has."""
        self._world_size: int | None = None
        self.can_control = False

    def start(self, post: Post) -> None:
        for target, name in ((self._run, "ptdash-live"), (self._send_loop, "ptdash-send")):
            thread = threading.Thread(target=target, args=(post,), name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def send(self, command: Command) -> None:
        if self.can_control:
            self._outbox.put_nowait(command)

    def close(self) -> None:
        self._outbox.put_nowait(None)
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=2)
        if self._client is not None:
            self._client.close()

    # The rest runs on the source's threads.

    def _send_loop(self, post: Post) -> None:
        while True:
            command = self._outbox.get()
            if command is None:
                return
            client = self._client
            try:
                if client is None:
                    raise TransportError("not connected")
                client.send(command)
            except (TransportError, OSError) as exc:
                post(Ack(id=command.id, name=command.name, ok=False, message=f"not sent: {exc}"))

    def _run(self, post: Post) -> None:
        tail = LogTail(self.run_dir / "output.log")
        try:
            history = load_history(self.run_dir)
            self._remember(history.series, history.walls)
            self._remember_ranks(history.ranks)
            self._remember_samples(history.samples)
            self._world_size = world_size(history.info, history.meta) or max(history.ranks, default=-1) + 1 or None
            self._pending = list(history.pending)
            self._last_event_id = max((e.id for e in history.events), default=0)
            post(history)
            lines = tail.read()
            if lines:
                post(LogLines(lines))
            connect_error = self._connect()
            if self._stop.is_set():
                return
            if connect_error is None:
                # Whatever the engine stored between our history read and the connection.
                backfill = self._read_new()
                if backfill is not None:
                    post(backfill)
                for event in self._read_new_events():
                    post(event)
                # The Welcome's world size travels beside run.json's, which may not know it yet.
                post(InfoChanged(self.info, world_size=self._world_size or 1))
                self.can_control = True
                post(Connection(True, "live"))
                self._load_pending(post)
                self._follow(post, tail)
                self.can_control = False
                if self._stop.is_set():
                    return
                post(Connection(False, "engine disconnected"))
            else:
                post(Connection(False, connect_error))
                self._load_pending(post)
            self._follow_files(post, tail)
        except Exception as exc:  # a source must not take the app down; say what happened
            self.can_control = False
            post(Connection(False, f"source failed: {exc}"))

    def _connect(self) -> str | None:
        """Connect; return None on success, else a short reason.

        Retries while the engine may still come up: run.json says starting, or its
        process is alive, for at most CONNECT_WAIT_S.
        """
        deadline = time.monotonic() + self.CONNECT_WAIT_S
        while not self._stop.is_set():
            info = read_run_info(self.run_dir) or self.info
            self.info = info
            if info is None:
                reason, status, pid = "no readable run.json", None, None
            else:
                status, pid = info.status, info.pid
                try:
                    client = Client(info.socket, rundir.read_token(self.run_dir), name=self.client_name)
                    welcome = client.connect(timeout=5.0)
                    self._client = client
                    self._world_size = max(welcome.world_size, self._world_size or 1)
                    return None
                except (TransportError, OSError) as exc:
                    reason = str(exc)
            if status in ENDED:
                return "engine not running"
            if time.monotonic() > deadline or (status != "starting" and pid and not rundir.pid_alive(pid)):
                return reason
            self._stop.wait(0.2)
        return "closed"

    def _follow(self, post: Post, tail: LogTail) -> None:
        """Relay the socket until it closes or the source is closed."""
        client = self._client
        assert client is not None
        next_poll = 0.0
        while not self._stop.is_set():
            try:
                msg = client.recv(timeout=POLL_S)
            except (TransportError, OSError, ValueError):
                return
            if isinstance(msg, Metrics):
                msg = self._filter(msg)
                if msg is not None:
                    post(msg)
            elif isinstance(msg, Samples):
                self._sampled[msg.rank] = max(self._sampled.get(msg.rank, 0.0), msg.rows[-1][0] if msg.rows else 0.0)
                post(msg)
            elif isinstance(msg, (Layers, LayerNames, Schedule)):
                post(msg)
            elif isinstance(msg, Event):
                if (msg.wall, msg.message) not in self._backfilled_events:
                    post(msg)
            elif isinstance(msg, (Status, Ack, Stacks)):
                post(msg)
            now = time.monotonic()
            if now >= next_poll:
                next_poll = now + POLL_S
                lines = tail.read()
                if lines:
                    post(LogLines(lines))
                if self._gaps:
                    self._fill_gaps(post)

    def _filter(self, msg: Metrics) -> Metrics | None:
        """Drop values the history already holds; note the gap when rows were dropped."""
        if msg.rank != 0:
            self._world_size = max(self._world_size or 1, msg.rank + 1)
            for step, _, values in msg.rows:
                for name in values:
                    key = (msg.rank, name)
                    self._rank_last[key] = max(self._rank_last.get(key, -1), step)
            return msg
        if msg.dropped and msg.rows:
            self._gaps.append((self._last_wall_step, msg.rows[0][0], time.monotonic() + 10.0))
        rows = []
        for step, wall, values in msg.rows:
            kept = {}
            for name, value in values.items():
                if step > self._last.get(name, -1):
                    kept[name] = value
                    self._last[name] = step
            if kept or step > self._last_wall_step:
                rows.append([step, wall, kept])
                self._last_wall_step = max(self._last_wall_step, step)
        return Metrics(rows=rows, rank=msg.rank, dropped=msg.dropped) if rows else None

    def _fill_gaps(self, post: Post) -> None:
        """Read dropped steps back from the store; retry a gap until the store has it."""
        try:
            reader = StoreReader(self.run_dir / STORE_NAME)
        except StoreError:
            return
        with reader:
            remaining = []
            for after, before, give_up in self._gaps:
                series = {}
                for name in reader.names():
                    steps, values = reader.series(name, max_points=HISTORY_POINTS, after_step=after)
                    cut = next((i for i, s in enumerate(steps) if s >= before), len(steps))
                    if cut:
                        series[name] = (steps[:cut], values[:cut])
                wsteps, walls = reader.walls(after_step=after)
                cut = next((i for i, s in enumerate(wsteps) if s >= before), len(wsteps))
                if series:
                    post(Backfill(series, (wsteps[:cut], walls[:cut])))
                elif time.monotonic() < give_up:
                    remaining.append((after, before, give_up))
            self._gaps = remaining

    def _follow_files(self, post: Post, tail: LogTail) -> None:
        """Without a connection: follow run.json, the store and output.log until the run ends.

        A run whose process is gone while run.json still says it runs is reported as
        crashed after a short grace (the launcher may still be writing its end). A run of
        several ranks is followed until its launcher is gone too: it records which rank
        failed how after rank 0's engine has written the end.
        """
        last_state = last_status = last_info = None
        ended_at: float | None = None
        gone_since: float | None = None
        while not self._stop.is_set():
            # Looked at before run.json is read, so the launcher's last words are read after it is gone.
            launcher_alive = _launcher_alive(self.info)
            info = read_run_info(self.run_dir)
            lines = tail.read()
            if lines:
                post(LogLines(lines))
            backfill = self._read_new()
            if backfill is not None:
                post(backfill)
            if info is not None:
                self.info = info
                if info != last_info:  # before the status, so a crash arrives with its failed ranks
                    post(InfoChanged(info))
                    last_info = info
                status = status_from_files(info, self._last_wall_step if self._last_wall_step >= 0 else None)
                if status.state not in ENDED and info.pid and not rundir.pid_alive(info.pid):
                    gone_since = gone_since or time.monotonic()
                    if time.monotonic() - gone_since > GONE_GRACE_S:
                        status = replace(status, state="crashed",
                                         detail="the engine process exited without recording how the run ended")
                if status.state != last_state or (status.state in ENDED and status != last_status):
                    post(status)
                    last_state, last_status = status.state, status
                if status.state in ENDED:
                    ended_at = ended_at or time.monotonic()
                    if not launcher_alive or time.monotonic() - ended_at > LAUNCHER_WAIT_S:
                        return
            self._stop.wait(1.0)

    def _load_pending(self, post: Post) -> None:
        """The series the first History left out (live rows that came meanwhile are kept)."""
        if self._pending:
            backfill = load_series(self.run_dir, self._pending)
            self._pending = []
            self._remember(backfill.series, ([], []))
            post(backfill)

    def _read_new_events(self) -> list[Event]:
        """Events the engine stored between our history read and the connection.

        Remembered so that the same events arriving live are not shown twice.
        """
        try:
            with StoreReader(self.run_dir / STORE_NAME) as reader:
                events = reader.events(after_id=self._last_event_id)
        except StoreError:
            return []
        self._backfilled_events = {(e.wall, e.message) for e in events}
        return events

    def _read_new(self) -> Backfill | None:
        try:
            reader = StoreReader(self.run_dir / STORE_NAME)
        except StoreError:
            return None
        with reader:
            series = {}
            for name in reader.names():
                if name in self._pending:
                    continue
                steps, values = reader.series(name, max_points=HISTORY_POINTS, after_step=self._last.get(name, -1))
                if steps:
                    series[name] = (steps, values)
            walls = reader.walls(after_step=self._last_wall_step)
            ranks = load_ranks(reader, range(1, self._world_size or 1), self._rank_last)
            samples = load_samples(reader, range(self._world_size or 1), self._sampled)
        if not series and not walls[0] and not ranks and not samples:
            return None
        self._remember(series, walls)
        self._remember_ranks(ranks)
        self._remember_samples(samples)
        return Backfill(series, walls, ranks, samples)

    def _remember(self, series: dict, walls: tuple[list[int], list[float]]) -> None:
        for name, (steps, _) in series.items():
            if steps:
                self._last[name] = max(self._last.get(name, -1), steps[-1])
        if walls[0]:
            self._last_wall_step = max(self._last_wall_step, walls[0][-1])

    def _remember_samples(self, samples: dict) -> None:
        for rank, own in samples.items():
            newest = max((walls[-1] for walls, _ in own.values() if walls), default=None)
            if newest is not None:
                self._sampled[rank] = max(self._sampled.get(rank, 0.0), newest)

    def _remember_ranks(self, ranks: dict) -> None:
        for rank, own in ranks.items():
            for name, (steps, _) in own.items():
                if steps:
                    self._rank_last[(rank, name)] = max(self._rank_last.get((rank, name), -1), steps[-1])


def _launcher_alive(info: RunInfo | None) -> bool:
    """Whether the launcher of a run of several ranks (not rank 0's own process) still runs."""
    if info is None:
        return False
    launcher = info.launcher_pid
    return bool(launcher) and launcher != info.pid and rundir.pid_alive(launcher)
