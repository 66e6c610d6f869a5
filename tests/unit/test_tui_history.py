"""What the dashboard reads from a run dir: history on attach, the rest of the series, per-rank
series, the status the files describe, and a replay of it all."""

from __future__ import annotations

import pytest

from ptdash.shared import rundir
from ptdash.shared.config import RunInfo
from ptdash.shared.protocol import Status
from ptdash.shared.reader import StoreReader
from ptdash.shared.store import STORE_NAME
from ptdash.tui.source import Backfill, Connection, History, LogLines
from ptdash.tui.source.history import load_history, load_series, status_from_files
from ptdash.tui.source.replay import ReplaySource
from support.inbox import Inbox
from support.recorded_run import RANK_LOSS, layer_names, make_ddp_run, make_run, run_info


def test_load_history_reads_everything(tmp_path):
    run_dir = make_run(tmp_path, steps=500, status="finished", exit_code=0)
    history = load_history(run_dir, first=None)
    steps, values = history.series["loss"]
    assert steps[0] == 1 and steps[-1] == 500 and len(values) == 500
    assert "opt/lr/group1" in history.series and "user/val_loss" in history.series
    walls, cpu = history.samples[0]["host/cpu_pct"]  # readings by time, one a second
    assert len(cpu) == 26 and walls == sorted(walls) and "host/cpu_pct" not in history.series
    assert history.walls[0][-1] == 500 and not history.pending
    assert [e.kind for e in history.events] == ["run", "checkpoint", "anomaly"]
    assert history.status == Status(state="finished", step=500, total_steps=2000, exit_code=0)


def test_load_history_reads_the_first_screen_first(tmp_path):
    run_dir = make_run(tmp_path, steps=50, status="finished", exit_code=0)
    history = load_history(run_dir)
    assert {"loss", "opt/lr/group0", "grad/norm_total", "time/step_s"} <= set(history.series)
    assert history.pending == ["user/val_loss"]
    rest = load_series(run_dir, history.pending)
    assert rest.series["user/val_loss"][0] == [50]


def test_load_history_without_a_store(tmp_path):
    run_dir = rundir.create(tmp_path, "fresh")
    history = load_history(run_dir)
    assert history.series == {} and history.status.state == "starting"


def test_history_loads_each_ranks_series(tmp_path):
    run_dir = make_ddp_run(tmp_path, steps=50)
    history = load_history(run_dir)
    assert sorted(history.ranks) == [1]
    assert {"loss", "time/step_s", "time/data_s"} <= set(history.ranks[1])
    assert set(history.samples[1]) == {"host/rss_bytes"}  # of the other ranks' readings, their memory
    assert "grad/norm_total" not in history.ranks[1]
    assert max(history.series["loss"][1]) < RANK_LOSS  # rank 0's loss only
    assert history.ranks[1]["loss"][0][-1] == 50


def test_the_store_finds_names_stored_before_the_window(tmp_path):
    run_dir = make_run(tmp_path, steps=200, layers=20)
    with StoreReader(run_dir / STORE_NAME) as reader:
        records = reader.layers(limit=10)
        names = reader.layer_names(records[0].step)
        assert reader.layer_names(3) is None  # before the first record
    assert [r.step for r in records] == list(range(164, 201, 4))
    assert names.names == layer_names(20) and names.step == 4  # stored with step 4's record, outside the window
    assert records[-1].update_ratios is not None  # step 200 sampled ratios


def test_replay_source_delivers_history_and_log(tmp_path):
    run_dir = make_run(tmp_path, steps=200, status="stopped")
    source, inbox = ReplaySource(run_dir), Inbox()
    assert not source.can_control and not source.live
    source.start(inbox)
    inbox.wait(lambda x: isinstance(x, Connection))
    source.close()
    kinds = [type(x) for x in inbox.items]
    assert kinds == [History, Backfill, LogLines, Connection]
    assert "user/val_loss" in inbox.items[1].series
    assert inbox.items[2].lines[-1].startswith("epoch 0 step 200 loss ")
    assert inbox.items[3].note == "replay (read-only)"


@pytest.mark.parametrize("fields, state", [({"status": "weird"}, "starting"), ({"status": "paused", "paused_at": 7}, "paused")])
def test_status_from_files(fields, state):
    # An unknown state reads as starting: run.json's reader drops it.
    info = RunInfo.from_json({**run_info().to_json(), **fields})
    status = status_from_files(info, 12)
    assert status.state == state and status.step == 12
