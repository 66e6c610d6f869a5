"""Snapshot tests: every tab at 120x40, the Overview and two runs side by side at 120x40 and
80x24, replayed from recorded runs.

The Overview is shot as it opens (with the LR schedule ahead) and with the chart keys at
work: the cursor on the schedule ahead, the strongest smoothing, the log scale, a zoom; and
with the metrics panel of what a script printed.

The runs are recorded at a fixed wall time with fixed seeds, and the clock the events
pane reads runs in UTC, so a screen is the same on every machine: the header's elapsed
time is that of a finished run (its end less its start), and nothing on screen names a
temporary path. ``pytest --snapshot-update tests/tui/test_snapshots.py`` rewrites the SVGs
under ``__snapshots__/`` after a deliberate change to what a screen shows; look at them
before committing.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from ptdash.shared.protocol import Event
from ptdash.tui.app import make_app
from ptdash.tui.compare import Comparison
from ptdash.tui.source.replay import ReplaySource
from support.pilot import until
from support.recorded_run import PROFILE_TOP, make_ddp_run, make_run, run_start

RECORDED_AT = 1_700_000_000.0
"""The wall time every snapshot run is recorded at (November 2023)."""

LAYERS = 120
"""Parameters in the single-rank run's layer records: more rows than a 40-line screen shows."""

WIDE, NARROW = (120, 40), (80, 24)


@pytest.fixture(autouse=True)
def utc(monkeypatch):
    """The events pane prints local times: make local time UTC for the test."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.fixture(scope="module")
def single_run(tmp_path_factory):
    """A finished single-rank run with per-layer records, a profile report and the LR schedule ahead."""
    profile = Event(kind="profile", step=455, wall=run_start(500, RECORDED_AT) + 2 + 455 * 0.05,
                    message="profiled steps 451-455: top op aten::addmm",
                    data={"steps": [451, 455], "device": "cpu", "top": PROFILE_TOP,
                          "trace": "/runs/demo/profiles/profile-step451-455.json"})
    return make_run(tmp_path_factory.mktemp("single"), steps=500, status="finished", exit_code=0, layers=LAYERS,
                    extra_events=[profile], now=RECORDED_AT, schedule=True)


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    """A finished run of two ranks, rank 1 twice as slow, with the doctor's findings."""
    return make_ddp_run(tmp_path_factory.mktemp("ddp"), steps=200, status="finished", exit_code=0, now=RECORDED_AT)


def replay(run_dir):
    """The dashboard on ``run_dir``, and what to run before the snapshot: wait until it is all drawn."""
    app = make_app(ReplaySource(run_dir))

    async def loaded(pilot) -> None:
        await until(pilot, lambda: app.state.connection_note == "replay (read-only)" and app.drawn,
                    what="the replay drawn")

    return app, loaded


@pytest.mark.parametrize("size", [WIDE, NARROW], ids=["120x40", "80x24"])
def test_overview(snap_compare, single_run, size):
    app, loaded = replay(single_run)
    assert snap_compare(app, terminal_size=size, run_before=loaded)


CHART_KEYS = {
    "cursor-ahead": ["full_stop", "greater_than_sign", "greater_than_sign", "greater_than_sign"],
    "smooth-log": ["e", "y"],
    "zoom-cursor": ["plus", "plus", "full_stop", "less_than_sign", "w"],
}


@pytest.mark.parametrize("size", [WIDE, NARROW], ids=["120x40", "80x24"])
@pytest.mark.parametrize("keys", list(CHART_KEYS))
def test_overview_chart_keys(snap_compare, single_run, size, keys):
    app, loaded = replay(single_run)
    assert snap_compare(app, press=CHART_KEYS[keys], terminal_size=size, run_before=loaded)


@pytest.fixture(scope="module")
def printed_run(tmp_path_factory):
    """The single-rank run with what its script printed every 50 steps: a validation loss,
    a validation accuracy and a test BLEU, as the engine stores them (printed/<name>)."""
    return make_run(tmp_path_factory.mktemp("printed"), steps=500, status="finished", exit_code=0,
                    now=RECORDED_AT, schedule=True, printed=True)


@pytest.mark.parametrize("size", [WIDE, NARROW], ids=["120x40", "80x24"])
def test_overview_with_printed_metrics(snap_compare, printed_run, size):
    """The metrics panel: the validation loss over the training loss, the first of three groups."""
    app, loaded = replay(printed_run)
    assert snap_compare(app, terminal_size=size, run_before=loaded)


def test_overview_printed_metrics_next_group(snap_compare, printed_run):
    """``v`` twice: the third group of printed metrics (the validation accuracy), at the cursor."""
    app, loaded = replay(printed_run)
    assert snap_compare(app, press=["v", "v", "full_stop"], terminal_size=WIDE, run_before=loaded)


@pytest.mark.parametrize("key", ["2", "3", "4"], ids=["layers", "system", "profiler"])
def test_single_rank_tabs(snap_compare, single_run, key):
    app, loaded = replay(single_run)
    assert snap_compare(app, press=[key], terminal_size=WIDE, run_before=loaded)


@pytest.mark.parametrize("key", ["5", "6"], ids=["ranks", "doctor"])
def test_ddp_tabs(snap_compare, ddp_run, key):
    app, loaded = replay(ddp_run)
    assert snap_compare(app, press=[key], terminal_size=WIDE, run_before=loaded)


@pytest.fixture(scope="module")
def engine_run(tmp_path_factory):
    """A two-rank run the real engine wrote (record_engine_run.py): rank 1 stopped mid-run and
    named stalled, a model trained in eval mode, a Python warning; copied, as replaying writes
    nothing but SQLite may want its side files beside the store."""
    run_dir = tmp_path_factory.mktemp("engine") / "run"
    shutil.copytree(Path(__file__).parent / "runs" / "ddp-stalled", run_dir)
    return run_dir


@pytest.mark.parametrize("key", ["1", "5", "6"], ids=["overview", "ranks", "doctor"])
def test_a_run_the_real_engine_wrote(snap_compare, engine_run, key):
    app, loaded = replay(engine_run)
    assert snap_compare(app, press=[key], terminal_size=WIDE, run_before=loaded)


@pytest.fixture(scope="module")
def hang_run(tmp_path_factory):
    """Two ranks the real engine ran (record_engine_run.py hang): rank 1 spun in Python at step 20
    while rank 0 waited in backward; the stall kept both ranks' stacks."""
    run_dir = tmp_path_factory.mktemp("hang") / "run"
    shutil.copytree(Path(__file__).parent / "runs" / "ddp-hang", run_dir)
    return run_dir


def test_the_ranks_tab_shows_the_stacks_a_stall_kept(snap_compare, hang_run):
    """Side by side from where the ranks differ (▶), the sentence naming where each one was on top."""
    app, loaded = replay(hang_run)
    assert snap_compare(app, press=["5"], terminal_size=WIDE, run_before=loaded)


def test_the_doctor_tab_says_where_the_stalled_ranks_were(snap_compare, hang_run):
    """The stall's finding: "rank 1 was in `wait_for_lost_shard` (train.py:48) ...; rank 0 waited in ..."."""
    app, loaded = replay(hang_run)
    assert snap_compare(app, press=["6"], terminal_size=WIDE, run_before=loaded)


def test_the_stacks_screen_of_two_ranks(snap_compare, hang_run):
    """``k``: the side by side, then every thread of each rank, over the Ranks tab."""
    app, loaded = replay(hang_run)
    assert snap_compare(app, press=["k"], terminal_size=WIDE, run_before=loaded)


@pytest.fixture(scope="module")
def skip_run(tmp_path_factory):
    """Two ranks the real engine ran (record_engine_run.py skip): rank 1 skipped step 12's backward
    and at the end waited in the final barrier while rank 0 waited in its last backward; the stall
    kept both ranks' stacks and flight recorders; gloo's timeout then ended the job."""
    run_dir = tmp_path_factory.mktemp("skip") / "run"
    shutil.copytree(Path(__file__).parent / "runs" / "ddp-skip", run_dir)
    return run_dir


@pytest.mark.parametrize("key", ["5", "k"], ids=["ranks", "stacks"])
def test_the_flight_recorder_names_the_collective_the_ranks_disagree_on(snap_compare, skip_run, key):
    """The sentence ends with "by the flight recorder, collective N of group 0 (default_pg) is not the
    same on every rank: rank 0 gloo:all_reduce, 178 elements, ...; rank 1 gloo:barrier, ..."; each
    rank's newest collectives follow the side by side, one line each."""
    app, loaded = replay(skip_run)
    assert snap_compare(app, press=[key], terminal_size=WIDE, run_before=loaded)


@pytest.fixture(scope="module")
def one_hang_run(tmp_path_factory):
    """One process the real engine ran (record_engine_run.py one-hang): its training thread waited
    8 s at step 10 for a lock its ``prefetch`` thread kept; the stall kept both threads' stacks."""
    run_dir = tmp_path_factory.mktemp("one-hang") / "run"
    shutil.copytree(Path(__file__).parent / "runs" / "one-hang", run_dir)
    return run_dir


@pytest.mark.parametrize("size", [WIDE, NARROW], ids=["120x40", "80x24"])
def test_the_stacks_screen_of_a_stalled_process(snap_compare, one_hang_run, size):
    """``k`` on one process: every thread's stack, the training thread first, each frame's file:line."""
    app, loaded = replay(one_hang_run)
    assert snap_compare(app, press=["k"], terminal_size=size, run_before=loaded)


def test_the_doctor_tab_says_how_long_the_process_stalled(snap_compare, one_hang_run):
    """The stall's finding with its whole length ("for 8 s"), not the timeout it was named at."""
    app, loaded = replay(one_hang_run)
    assert snap_compare(app, press=["6"], terminal_size=WIDE, run_before=loaded)


@pytest.fixture(scope="module")
def compared_runs(tmp_path_factory):
    """Two finished runs of different lengths and seeds, to be shown side by side."""
    root = tmp_path_factory.mktemp("compare")
    return (make_run(root, steps=500, status="finished", exit_code=0, name="baseline", now=RECORDED_AT),
            make_run(root, steps=300, status="finished", exit_code=0, name="lr-3e-3", seed=3, now=RECORDED_AT))


@pytest.mark.parametrize("size", [WIDE, NARROW], ids=["120x40", "80x24"])
def test_compare(snap_compare, compared_runs, size):
    """``ptdash show A B``: the runs overlaid on the loss, LR and grad-norm charts, and their key figures."""
    main, other = compared_runs
    app = make_app(ReplaySource(main), comparison=Comparison((other,)))

    async def loaded(pilot) -> None:
        await until(pilot, lambda: app.state.connection_note == "replay (read-only)" and app.drawn,
                    what="both runs drawn")

    assert snap_compare(app, terminal_size=size, run_before=loaded)


METRICS_KEYS = {
    "grid": ["7"],
    "filtered": ["7", "slash", "v", "a", "l", "enter"],
    "zoomed": ["7", "right", "right", "enter"],
}


@pytest.mark.parametrize("size", [WIDE, NARROW], ids=["120x40", "80x24"])
@pytest.mark.parametrize("keys", list(METRICS_KEYS))
def test_the_metrics_tab(snap_compare, printed_run, size, keys):
    """Every series in a grid, what the script printed first; ``/val`` keeps the three ``val``
    ones; Enter zooms the third chart of the page."""
    app, loaded = replay(printed_run)
    assert snap_compare(app, press=METRICS_KEYS[keys], terminal_size=size, run_before=loaded)


def test_a_series_pinned_to_the_overview(snap_compare, printed_run):
    """``*`` on the Metrics tab's second chart, then the Overview: it takes the speed chart's place."""
    app, loaded = replay(printed_run)
    assert snap_compare(app, press=["7", "right", "asterisk", "1"], terminal_size=WIDE, run_before=loaded)


@pytest.mark.parametrize("marked", [False, True], ids=["list", "two-marked"])
def test_the_runs_view(snap_compare, compared_runs, single_run, marked):
    """``ptdash runs``: three runs, newest first, with their state, steps, newest loss and start;
    Space marks two (numbered in the order marked)."""
    from ptdash.shared import rundir
    from ptdash.tui.runs import RunSummary
    from ptdash.tui.runsview import run_rows
    from ptdash.tui.widgets.runs_app import RunsApp

    app = RunsApp(run_rows([RunSummary(p, rundir.read_info(p)) for p in (*compared_runs, single_run)]))
    keys = ["space", "space"] if marked else []
    assert snap_compare(app, press=keys, terminal_size=NARROW)
