"""Where the dashboard's data comes from: a live engine, or a finished run's files.

Plain classes and threads, no Textual: a source is started with a ``post(obj)`` callback
and calls it from its own thread with what it learns, in order:

- one ``History`` (everything the store held when the source looked),
- then live protocol messages (``Metrics``, ``Status``, ``Ack``, ``Event``, ``LayerNames``, ``Layers``),
  ``Backfill`` (rows read back from the store to fill a gap in the live stream),
  ``LogLines`` (new lines of the script's output.log), ``RunInfo`` (run.json changed)
  and ``Connection`` (the link to the engine came up, went down, or never will).

The app must treat ``post`` as called from a foreign thread.
"""

from __future__ import annotations

import itertools
import os
import queue
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from ptdash.shared import rundir
from ptdash.shared.protocol import ENDED, STATES, Ack, Command, Event, LayerNames, Layers, Metrics, Status
from ptdash.shared.reader import StoreReader
from ptdash.shared.store import STORE_NAME, StoreError
from ptdash.shared.transport import Client, TransportError

from .series import rank_wants

HISTORY_POINTS = 4000
"""Points per series read from the store on (re)attach; decimated in SQL beyond that."""

FIRST_SERIES = ("loss", "opt", "grad/", "time/step_s", "throughput/")
"""Prefixes of the series the first screen charts; they are read first on attach, since
decimating a long series costs a scan of it (about a second per million steps)."""

LAYER_FLUSHES = 300
"""Newest per-parameter gradient records (one per engine flush) read on attach."""

RANK_POINTS = 1000
"""Points per series of each rank above 0 read on attach (the few series the Ranks tab reads)."""

HISTORY_WALLS = 1000
"""Newest step wall times read on attach (for steps/s; elapsed time comes from run.json)."""

LOG_TAIL_BYTES = 256 * 1024
"""How much of an existing output.log is read back on attach."""

GONE_GRACE_S = 3.0
"""Seconds a dead engine process may leave run.json unfinished before the run counts as crashed."""

LAUNCHER_WAIT_S = 30.0
"""Longest a source follows an ended run's files while its launcher still runs (to read failed ranks)."""

POLL_S = 0.5
"""How often the source thread looks at output.log and run.json between messages."""


# -------------------------------------------------------------------------- deliveries


@dataclass
class History:
    """The run as stored when the source attached."""

    info: dict
    """run.json."""
    series: dict[str, tuple[list[int], list[float | None]]]
    walls: tuple[list[int], list[float]]
    """(steps, wall times) of rank 0, for elapsed time and steps/s."""
    events: list[Event]
    status: Status | None
    """The status the files describe (None before the engine wrote any)."""
    meta: dict = field(default_factory=dict)
    pending: list[str] = field(default_factory=list)
    """Series left out to show the charts sooner; a Backfill with them follows."""
    layers: list[Layers] = field(default_factory=list)
    """The newest stored per-parameter records, oldest first."""
    layer_names: LayerNames | None = None
    """The parameter names those records follow."""
    ranks: dict[int, dict[str, tuple[list[int], list[float | None]]]] = field(default_factory=dict)
    """Per rank above 0, the series the Ranks tab reads (decimated to RANK_POINTS)."""


@dataclass
class Backfill:
    """Rows read back from the store for steps the live stream dropped or missed."""

    series: dict[str, tuple[list[int], list[float | None]]]
    walls: tuple[list[int], list[float]]
    ranks: dict[int, dict[str, tuple[list[int], list[float | None]]]] = field(default_factory=dict)
    """Per rank above 0, new rows of the series the Ranks tab reads."""


@dataclass
class RunInfo:
    """run.json as read now (with the world size the engine's Welcome gave): failed ranks, end time."""

    info: dict


@dataclass
class LogLines:
    """New complete lines of output.log."""

    lines: list[str]


@dataclass
class Connection:
    """The link to the engine changed: ``connected``, and a short note for the header."""

    connected: bool
    note: str


Post = Callable[[object], None]


# ----------------------------------------------------------------------------- sources


class Source:
    """The contract the dashboard reads: start, send, close, and capability flags.

    Capability flags the app reads: ``live`` (the source follows a running engine and
    may control it), ``can_control`` (commands can be sent now: live and connected).
    """

    live: bool = False
    can_control: bool = False

    def __init__(self, run_dir: Path | str) -> None:
        self.run_dir = Path(run_dir)
        self.info: dict = {}
        try:
            self.info = rundir.read_info(self.run_dir).to_json()
        except (FileNotFoundError, ValueError):
            pass

    @property
    def name(self) -> str:
        return str(self.info.get("name") or self.run_dir.name)

    def start(self, post: Post) -> None:
        """Begin delivering to ``post`` from a background thread; returns at once."""
        raise NotImplementedError

    def send(self, command: Command) -> None:
        """Queue a command for the engine; never blocks. Ignored when it cannot control."""

    def close(self) -> None:
        """Stop the background thread, after sending what was queued (briefly)."""


class ReplaySource(Source):
    """A run's history only, read-only: for finished runs, ``ptdash show`` and tests."""

    can_control = False

    def __init__(self, run_dir: Path | str) -> None:
        super().__init__(run_dir)
        self._thread: threading.Thread | None = None

    def start(self, post: Post) -> None:
        self._thread = threading.Thread(target=self._run, args=(post,), name="ptdash-replay", daemon=True)
        self._thread.start()

    def _run(self, post: Post) -> None:
        history = load_history(self.run_dir)
        post(history)
        if history.pending:
            post(load_series(self.run_dir, history.pending))
        tail = LogTail(self.run_dir / "output.log")
        lines = tail.read()
        if lines:
            post(LogLines(lines))
        post(Connection(False, "replay (read-only)"))

    def close(self) -> None:
        if self._thread is not None:
            self._thread.join(timeout=2)


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
                post(RunInfo({**self.info, "world_size": self._world_size or 1}))
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
            info = _read_info(self.run_dir) or self.info
            self.info = info
            status, pid = info.get("status"), info.get("pid")
            try:
                client = Client(info["socket"], rundir.read_token(self.run_dir), name=self.client_name)
                welcome = client.connect(timeout=5.0)
                self._client = client
                self._world_size = max(welcome.world_size, self._world_size or 1)
                return None
            except (TransportError, OSError, KeyError) as exc:
                reason = "run.json names no socket" if isinstance(exc, KeyError) else str(exc)
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
            elif isinstance(msg, (Layers, LayerNames)):
                post(msg)
            elif isinstance(msg, Event):
                if (msg.wall, msg.message) not in self._backfilled_events:
                    post(msg)
            elif isinstance(msg, (Status, Ack)):
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
            info = _read_info(self.run_dir)
            lines = tail.read()
            if lines:
                post(LogLines(lines))
            backfill = self._read_new()
            if backfill is not None:
                post(backfill)
            if info is not None:
                self.info = info
                if info != last_info:  # before the status, so a crash arrives with its failed ranks
                    post(RunInfo(info))
                    last_info = info
                status = status_from_files(info, self._last_wall_step if self._last_wall_step >= 0 else None)
                if status.state not in ENDED and info.get("pid") and not rundir.pid_alive(info["pid"]):
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
                rows = reader.events(after_id=self._last_event_id)
        except StoreError:
            return []
        events = rows
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
        if not series and not walls[0] and not ranks:
            return None
        self._remember(series, walls)
        self._remember_ranks(ranks)
        return Backfill(series, walls, ranks)

    def _remember(self, series: dict, walls: tuple[list[int], list[float]]) -> None:
        for name, (steps, _) in series.items():
            if steps:
                self._last[name] = max(self._last.get(name, -1), steps[-1])
        if walls[0]:
            self._last_wall_step = max(self._last_wall_step, walls[0][-1])

    def _remember_ranks(self, ranks: dict) -> None:
        for rank, own in ranks.items():
            for name, (steps, _) in own.items():
                if steps:
                    self._rank_last[(rank, name)] = max(self._rank_last.get((rank, name), -1), steps[-1])


# ------------------------------------------------------------------------------ helpers


def _launcher_alive(info: dict) -> bool:
    """Whether the launcher of a run of several ranks (not rank 0's own process) still runs."""
    launcher = info.get("launcher_pid")
    return bool(launcher) and launcher != info.get("pid") and rundir.pid_alive(launcher)


def _read_info(run_dir: Path) -> dict | None:
    try:
        return rundir.read_info(run_dir).to_json()
    except (FileNotFoundError, ValueError):
        return None


def load_history(run_dir: Path, first: tuple[str, ...] | None = FIRST_SERIES) -> History:
    """What the run dir holds now; an empty History when the store is not there yet.

    With ``first`` (name prefixes), only those series are read and the others are
    listed in ``History.pending`` for ``load_series``; with None, every series is read.
    """
    info = _read_info(run_dir) or {}
    series: dict[str, tuple[list[int], list[float | None]]] = {}
    walls: tuple[list[int], list[float]] = ([], [])
    events: list[Event] = []
    meta: dict = {}
    pending: list[str] = []
    layers: list[Layers] = []
    names: LayerNames | None = None
    ranks: dict[int, dict] = {}
    damage: StoreError | None = None
    try:
        reader = StoreReader(Path(run_dir) / STORE_NAME)
    except StoreError as exc:
        reader = None
        if (Path(run_dir) / STORE_NAME).exists():
            damage = exc
    if reader is not None:
        with reader:
            for name in reader.names():
                if first is None or name.startswith(first):
                    series[name] = reader.series(name, max_points=HISTORY_POINTS)
                else:
                    pending.append(name)
            last = reader.last_step()
            walls = reader.walls(after_step=None if last is None else last - HISTORY_WALLS)
            events = reader.events()
            meta = reader.meta()
            layers = reader.layers(limit=LAYER_FLUSHES)
            names = reader.layer_names(layers[-1].step) if layers else None
            size = world_size(info, meta)
            ranks = load_ranks(reader, range(1, size) if size else [r for r in reader.ranks() if r != 0])
            damage = reader.damage
    if damage is not None:  # shown in the events pane: what was read, and where it stopped
        events.append(Event(kind="warning", step=None, wall=time.time(), message=str(damage)))
    last_step = walls[0][-1] if walls[0] else None
    status = status_from_files(info, last_step) if info else None
    return History(info=info, series=series, walls=walls, events=events, status=status, meta=meta,
                   pending=pending, layers=layers, layer_names=names, ranks=ranks)


def world_size(info: dict, meta: dict) -> int | None:
    """The run's number of ranks as run.json or the store's meta recorded it; None when neither did."""
    for size in (info.get("world_size"), meta.get("world_size")):
        if isinstance(size, int) and not isinstance(size, bool) and size >= 1:
            return size
    return None


def load_ranks(reader: StoreReader, ranks, after: dict[tuple[int, str], int] | None = None) -> dict:
    """``{rank: {name: (steps, values)}}`` of the series the Ranks tab reads, for ``ranks``.

    With ``after`` (``(rank, name)`` -> step), only newer rows; ranks and series without
    any are left out.
    """
    names = [n for n in reader.names() if rank_wants(n)]
    out: dict[int, dict] = {}
    for rank in ranks:
        own = {}
        for name in names:
            steps, values = reader.series(name, rank=rank, max_points=RANK_POINTS,
                                          after_step=None if after is None else after.get((rank, name), -1))
            if steps:
                own[name] = (steps, values)
        if own:
            out[rank] = own
    return out


def load_series(run_dir: Path, names: list[str]) -> Backfill:
    """The whole (decimated) history of ``names``, as a Backfill."""
    series = {}
    try:
        reader = StoreReader(Path(run_dir) / STORE_NAME)
    except StoreError:
        return Backfill({}, ([], []))
    with reader:
        for name in names:
            series[name] = reader.series(name, max_points=HISTORY_POINTS)
    return Backfill(series, ([], []))


def status_from_files(info: dict, last_step: int | None) -> Status:
    """The Status a run dir describes, for a run the dashboard cannot ask."""
    state = info.get("status")
    if state not in STATES:
        state = "starting"
    total = info.get("total_steps")
    clip = info.get("clip")
    recorded = info.get("step")
    return Status(
        state=state,
        step=max(last_step or 0, recorded if isinstance(recorded, int) else 0),
        total_steps=int(total) if isinstance(total, (int, float)) else None,
        paused_at=info.get("paused_at"),
        clip=float(clip) if isinstance(clip, (int, float)) else None,
        lr_scale=float(info.get("lr_scale") or 1.0),
        exit_code=info.get("exit_code"),
        detail=str(info.get("detail") or info.get("error") or ""),
    )


class LogTail:
    """Follows a text file that grows: returns new complete lines on each ``read()``.

    The first read returns the last ``LOG_TAIL_BYTES`` of the file. A carriage return
    (progress bars) keeps only the text after it; a file that shrank is re-read from the start.
    """

    def __init__(self, path: Path, max_bytes: int = LOG_TAIL_BYTES) -> None:
        self.path = Path(path)
        self._offset: int | None = None
        self._partial = b""
        self._max_bytes = max_bytes

    def read(self) -> list[str]:
        try:
            size = os.stat(self.path).st_size
        except OSError:
            return []
        if self._offset is None:
            self._offset = max(0, size - self._max_bytes)
            skip_first = self._offset > 0
        else:
            skip_first = False
        if size < self._offset:
            self._offset, self._partial = 0, b""
        if size == self._offset:
            return []
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            data = f.read(size - self._offset)
        self._offset += len(data)
        data = self._partial + data
        *complete, self._partial = data.split(b"\n")
        if skip_first and complete:
            complete = complete[1:]
        return [line.decode("utf-8", "replace").rstrip("\r").rsplit("\r", 1)[-1] for line in complete]


_ids = itertools.count(1)


def new_command_id() -> str:
    """A command id unique across dashboards attached to the same run."""
    return f"{os.getpid()}-{int(time.time() * 1000) % 100000000}-{next(_ids)}"
