"""What the Ranks tab shows: one row per DDP rank, and every rank's step time.

Pure functions from RunState to numbers and Rich renderables (no Textual), tested
without an app. Rank 0 publishes every rank's rows; RunState keeps each rank's series
apart (rank 0's are the Overview's), and this module only reads them.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ptdash.shared import names
from ptdash.shared.exits import describe_exit
from ptdash.shared.stacks import render

from ..chart import Chart, Line
from ..fmt import fmt_bytes, fmt_ms, fmt_num, fmt_si
from ..series import Series, rank_wants
from ..state import RunState
from .overview import PALETTE

RANK_WINDOW = 50
"""Recent steps whose medians make a rank's step time, data share and samples/s."""

STRAGGLER = 1.2
"""A straggler score above this (a rank 20% slower than the median rank) is highlighted."""

SINGLE = "A single-process run: the Ranks tab shows runs of several ranks (--nproc-per-node N or torchrun)."


@dataclass
class RankRow:
    """The numbers of one rank's row in the table."""

    rank: int
    host: str = ""
    """The host it runs on, when known."""
    step: int | None = None
    loss: float | None = None
    step_s: float | None = None
    """Median step time over the last RANK_WINDOW steps."""
    data_share: float | None = None
    """Median data wait / median step time."""
    samples_per_s: float | None = None
    memory: float | None = None
    memory_kind: str = ""
    """``gpu`` (allocated by this rank's process), ``rss`` (host memory), or '' when unknown."""
    straggler: float | None = None
    """This rank's median step time / the median over ranks."""
    status: str = "ok"
    """``ok``, ``stalled``, ``failed``, ``stopped`` (by the launcher after another failed), or the run's end."""
    detail: str = ""


def _median(series: Series | None, window: int = RANK_WINDOW) -> float | None:
    if series is None:
        return None
    values = [v for v in series.values[-window:] if v is not None]
    return statistics.median(values) if values else None


def rank_ids(state: RunState) -> list[int]:
    """Every rank of the run: as many as the world size, plus any that sent rows."""
    return sorted(set(range(state.world_size)) | set(state.rank_series) | set(state.samples))


def rank_rows(state: RunState, window: int = RANK_WINDOW) -> list[RankRow]:
    """One RankRow per rank, straggler scores included."""
    rows = []
    first_failure = next(iter(state.rank_failures), None)
    for rank in rank_ids(state):
        own = state.rank_series.get(rank, {})
        row = RankRow(rank=rank, host=state.hosts.get(rank, ""), step=state.rank_step(rank))
        loss = own.get(names.LOSS)
        row.loss = loss.latest() if loss is not None else None
        row.step_s = _median(own.get(names.STEP_S), window)
        data_s = _median(own.get(names.DATA_S), window)
        row.data_share = data_s / row.step_s if data_s is not None and row.step_s else None
        row.samples_per_s = _median(own.get(names.SAMPLES_PER_S), window)
        readings = state.samples.get(rank, {})
        gpu = [s.latest() for n, s in readings.items()
               if (found := names.parse_gpu(n)) is not None and found[1] == "mem_allocated_bytes"]
        gpu = [v for v in gpu if v is not None]
        rss = readings.get(names.HOST_RSS)
        if gpu:
            row.memory, row.memory_kind = sum(gpu), "gpu"
        elif rss is not None and rss.latest() is not None:
            row.memory, row.memory_kind = rss.latest(), "rss"
        if rank in state.rank_failures:
            row.status = "failed" if rank == first_failure else "stopped"
            row.detail = describe_exit(state.rank_failures[rank])
        elif rank in state.stalled and (row.step is None or row.step <= state.stalled[rank]):
            row.status, row.detail = "stalled", f"at step {state.stalled[rank]}"
        elif state.ended:
            row.status = state.status.state
        rows.append(row)
    times = [r.step_s for r in rows if r.step_s is not None]
    middle = statistics.median(times) if times else None
    for row in rows:
        if row.step_s is not None and middle:
            row.straggler = row.step_s / middle
    return by_host(rows)


def by_host(rows: list[RankRow]) -> list[RankRow]:
    """The rows grouped by host, each host where its lowest rank is (rank 0's first)."""
    first: dict[str, int] = {}
    for r in rows:
        first.setdefault(r.host, r.rank)
    return sorted(rows, key=lambda r: (first[r.host], r.rank))


STATUS_STYLES = {"ok": "green", "stalled": "bold yellow", "failed": "bold white on red", "stopped": "yellow",
                 "finished": "green", "crashed": "red"}
"""Colour of each status; a run that ended without a failed rank shows its end (finished, stopped, crashed)."""


def table(state: RunState, width: int = 0) -> RenderableType:
    """The rank table, with a line on what the straggler score means and how the run ended."""
    if state.world_size <= 1:
        return Text(f" {SINGLE}", "dim")
    rows = rank_rows(state)
    gpu = any(r.memory_kind == "gpu" for r in rows)
    # Below 100 columns the headers take two lines, so all nine columns fit in 80.
    sep = " " if width >= 100 else "\n"
    grid = Table(box=None, padding=(0, 0, 0, 1), header_style="bold", expand=False)
    hosts = len({r.host for r in rows}) > 1
    if hosts:  # a job of several nodes: each host named once, above its ranks
        grid.add_column("host", no_wrap=True, overflow="ellipsis", max_width=24, vertical="bottom")
    for name in ("rank", "step", "loss", f"step{sep}time", f"data{sep}wait", f"samples{sep}per s",
                 f"GPU{sep}alloc" if gpu else "RSS", "straggler"):
        grid.add_column(name, justify="right", no_wrap=True, vertical="bottom")
    grid.add_column("status", no_wrap=True, overflow="ellipsis")
    shown_host = None
    for r in rows:
        slow = r.straggler is not None and r.straggler > STRAGGLER
        host = [] if not hosts else [Text("" if r.host == shown_host else r.host or "?", "bold cyan")]
        shown_host = r.host
        memory = fmt_bytes(r.memory) + (" rss" if gpu and r.memory_kind == "rss" else "")
        status = Text(r.status, STATUS_STYLES.get(r.status, ""))
        if r.detail:
            status.append(f" {r.detail}", "bold" if r.status == "failed" else "dim")
        grid.add_row(
            *host,
            Text(str(r.rank), "bold red" if slow else "bold"),
            "—" if r.step is None else f"{r.step:,}",
            fmt_num(r.loss, 4),
            fmt_ms(r.step_s),
            "N/A" if r.data_share is None else f"{r.data_share:.0%}",
            fmt_si(r.samples_per_s, 3),
            memory,
            Text("N/A" if r.straggler is None else f"{r.straggler:.2f}×", "bold white on red" if slow else ""),
            status)
    lines: list[RenderableType] = []
    if state.rank_failures and state.status is not None and state.status.detail:
        lines.append(Text(f" {state.status.detail.strip().splitlines()[-1]}", "bold red"))
    lines.append(grid)
    lines.append(Text(f" straggler: the rank's median step time / the median over ranks; > {STRAGGLER} in red",
                      "dim"))
    return Group(*lines)


def step_chart(state: RunState) -> tuple[Text, Chart]:
    """Step time per rank, one line (and colour) each, with each rank's median in the legend."""
    lines, parts = [], []
    for i, rank in enumerate(rank_ids(state)):
        series = state.rank_series.get(rank, {}).get(names.STEP_S)
        if series is None or not series.steps:
            continue
        style = PALETTE[i % len(PALETTE)]
        lines.append(Line(series.steps, series.values, style))
        if len(parts) < 8:
            parts.append(Text.assemble((f"r{rank} ", "dim"), (fmt_ms(_median(series)), style)))
    if not lines:
        return Text("no step times yet", "dim"), Chart()
    legend = Text("  ").join(parts)
    if len(lines) > len(parts):
        legend.append(f"  +{len(lines) - len(parts)}", "dim")
    return legend, Chart(lines, log_y="auto")


def stacks_view(state: RunState, width: int = 100) -> RenderableType | None:
    """Every rank's training-thread stacks side by side (``k`` asks for them; a stall keeps its
    own): the sentence naming where each rank is, the common frames folded, ▶ where ranks differ."""
    if state.stacks is None:
        return None
    when, found = state.stacks
    lines = render(list(found), width=max(40, width - 2), all_threads=False)
    out = Text.assemble((" stacks ", "bold"), (f"{when}  (k shows every thread)", "dim"))
    for i, line in enumerate(lines):
        style = "bold" if i == 0 else "yellow" if "▶" in line else "dim" if line.endswith(":") else ""
        out.append("\n " + line, style)
    return out


def versions(state: RunState) -> tuple:
    """A cheap fingerprint of everything the tab reads, to skip unchanged redraws."""
    return (state.world_size, id(state.stacks), tuple(sorted(state.stalled.items())), tuple(state.rank_failures.items()),
            tuple(sorted(state.hosts.items())),
            state.status.state if state.status is not None else None,
            tuple((rank, tuple(s.version for n, s in own.items() if rank_wants(n)))
                  for rank, own in sorted(state.rank_series.items())),
            tuple((rank, tuple(s.version for s in own.values())) for rank, own in sorted(state.samples.items())))
