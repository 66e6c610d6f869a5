"""The Ranks tab's rows and chart: straggler scores, memory, stalls, failed ranks, one rank."""

from __future__ import annotations

from io import StringIO

from rich.console import Console

from ptdash.shared import events
from ptdash.shared.protocol import Event, Metrics, Samples, Status
from ptdash.tui.state import RunState
from ptdash.tui.tabs import ranks
from support.recorded_run import RANK_LOSS, run_info
from support.render import text_of


def rows(rank_steps: dict[int, float], steps=range(1, 21), **readings) -> RunState:
    """A state with ``steps`` of each rank, its step time as given, and ``readings`` by time."""
    state = RunState()
    for rank, step_s in rank_steps.items():
        state.add_metrics(Metrics(rank=rank, rows=[
            [s, 0.0, {"loss": RANK_LOSS * rank + 1.0, "time/step_s": step_s, "time/data_s": step_s / 4,
                      "throughput/samples_per_s": 64 / step_s, "grad/norm_total": 1.0}] for s in steps]))
        if readings:
            state.add_samples(Samples(rank=rank, rows=[[1.0, readings]]))
    return state


def test_state_keeps_ranks_apart():
    state = rows({0: 0.05, 1: 0.1})
    assert state.world_size == 2
    assert set(state.series["loss"].values) == {1.0}  # rank 0's own, nothing of rank 1
    assert state.rank_series[0] is state.series
    assert state.rank_series[1]["loss"].latest() == RANK_LOSS + 1.0
    assert "grad/norm_total" not in state.rank_series[1]  # only what the Ranks tab reads
    assert state.rank_step(1) == 20


def test_rank_rows_scores_stragglers_and_says_why_a_rank_stopped():
    state = rows({0: 0.05, 1: 0.05, 2: 0.09}, **{"host/rss_bytes": 2.0 ** 30})
    state.add_samples(Samples(rank=1, rows=[[2.0, {"gpu1/mem_allocated_bytes": 3 * 2.0 ** 30}]]))
    by_rank = {r.rank: r for r in ranks.rank_rows(state)}
    assert by_rank[2].straggler == 0.09 / 0.05 and by_rank[0].straggler == 1.0
    assert by_rank[2].data_share == 0.25 and by_rank[2].samples_per_s == 64 / 0.09
    assert (by_rank[1].memory, by_rank[1].memory_kind) == (3 * 2.0 ** 30, "gpu")
    assert (by_rank[0].memory_kind, by_rank[0].status) == ("rss", "ok")

    # The slow rank's score is drawn white on red; the others plainly.
    console = Console(width=100, file=StringIO())
    lines = console.render_lines(ranks.table(state, 100), console.options.update(height=None), pad=False)
    scores = {seg.text.strip(): seg.style for line in lines for seg in line if seg.text.strip().endswith("×")}
    assert scores["1.80×"].bgcolor.name == "red"
    assert scores["1.00×"] is None or scores["1.00×"].bgcolor is None

    kind, data = events.encode(events.Stall(step=20, ranks=(2,), seconds=130.0))
    state.add_event(Event(kind=kind, step=20, wall=1.0, data=data, message="rank 2 stalled: no step for 130 s (at step 20)"))
    assert ranks.rank_rows(state)[2].status == "stalled"
    state.add_metrics(Metrics(rank=2, rows=[[21, 0.0, {"time/step_s": 0.09}]]))
    assert ranks.rank_rows(state)[2].status == "ok"  # it stepped again

    state.note_info(run_info(world_size=3, rank_failures=[{"rank": 2, "exitcode": -9}, {"rank": 0, "exitcode": 1}]))
    state.set_status(Status(state="crashed", step=21, exit_code=-9, detail="rank 2 killed by SIGKILL"))
    by_rank = {r.rank: r for r in ranks.rank_rows(state)}
    assert (by_rank[2].status, by_rank[2].detail) == ("failed", "killed by SIGKILL")
    assert (by_rank[0].status, by_rank[0].detail) == ("stopped", "exit code 1")
    assert by_rank[1].status == "crashed"
    text = text_of(ranks.table(state, 100))
    assert "failed killed by SIGKILL" in text and "rank 2 killed by SIGKILL" in text
    legend, chart = ranks.step_chart(state)
    assert len(chart.lines) == 3 and "r2 90.0 ms" in legend.plain


def test_single_process_says_so():
    state = rows({0: 0.05})
    assert state.world_size == 1
    assert "single-process run" in text_of(ranks.table(state))


def test_ranks_of_several_hosts_are_grouped_under_each_host():
    state = rows({0: 0.05, 1: 0.05, 2: 0.05, 3: 0.05})
    state.note_info(run_info(world_size=4, hosts={"0": "gpu-a", "1": "gpu-b", "2": "gpu-a", "3": "gpu-b"}))
    assert [(r.host, r.rank) for r in ranks.rank_rows(state)] == [("gpu-a", 0), ("gpu-a", 2), ("gpu-b", 1),
                                                                  ("gpu-b", 3)]
    lines = [line.split() for line in text_of(ranks.table(state), width=120).splitlines()]
    named = [(words[0], words[1]) for words in lines if words and words[0].startswith("gpu-")]
    assert named == [("gpu-a", "0"), ("gpu-b", "1")]  # each host once, on its first rank's line
    assert [words[0] for words in lines if words and words[0] in ("1", "2", "3")] == ["2", "3"]
    single = rows({0: 0.05, 1: 0.05})
    single.note_info(run_info(world_size=2, hosts={"0": "gpu-a", "1": "gpu-a"}))
    assert "host" not in text_of(ranks.table(single), width=120).split()  # one host: no column for it
