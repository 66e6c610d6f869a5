"""Sources: history from the store, the live socket (a real Server), output.log tailing."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from ptdash.shared import rundir
from ptdash.shared.protocol import Command, Metrics, Status
from ptdash.shared.store import STORE_NAME, StoreWriter
from ptdash.tui import source as source_mod
from ptdash.tui.source import Backfill, Connection, History, LiveSource, LogLines, LogTail, ReplaySource, load_history
from support.inbox import Inbox
from support.recorded_run import FakeEngine, demo_row, make_run


def test_load_history_reads_everything(tmp_path):
    run_dir = make_run(tmp_path, steps=500, status="finished", exit_code=0)
    history = load_history(run_dir, first=None)
    steps, values = history.series["loss"]
    assert steps[0] == 1 and steps[-1] == 500 and len(values) == 500
    assert "opt/lr/group1" in history.series and "host/cpu_pct" in history.series
    assert history.walls[0][-1] == 500 and not history.pending
    assert [e.kind for e in history.events] == ["run", "checkpoint", "anomaly"]
    assert history.status == Status(state="finished", step=500, total_steps=2000, exit_code=0)


def test_load_history_reads_the_first_screen_first(tmp_path):
    run_dir = make_run(tmp_path, steps=50, status="finished", exit_code=0)
    history = load_history(run_dir)
    assert {"loss", "opt/lr/group0", "grad/norm_total", "time/step_s"} <= set(history.series)
    assert sorted(history.pending) == ["host/cpu_pct", "host/rss_bytes"]
    rest = source_mod.load_series(run_dir, history.pending)
    assert len(rest.series["host/cpu_pct"][0]) == 50


def test_load_history_without_a_store(tmp_path):
    run_dir = rundir.create(tmp_path, "fresh")
    history = load_history(run_dir)
    assert history.series == {} and history.status.state == "starting"


def test_replay_source_delivers_history_and_log(tmp_path):
    run_dir = make_run(tmp_path, steps=200, status="stopped")
    source, inbox = ReplaySource(run_dir), Inbox()
    assert not source.can_control and not source.live
    source.start(inbox)
    inbox.wait(lambda x: isinstance(x, Connection))
    source.close()
    kinds = [type(x) for x in inbox.items]
    assert kinds == [History, Backfill, LogLines, Connection]
    assert "host/cpu_pct" in inbox.items[1].series
    assert inbox.items[2].lines[-1].startswith("epoch 0 step 200 loss ")
    assert inbox.items[3].note == "replay (read-only)"


def test_live_source_follows_socket_without_duplicates(tmp_path):
    run_dir = make_run(tmp_path, steps=500, status="running")
    with FakeEngine(run_dir, step=500) as engine:
        source, inbox = LiveSource(run_dir), Inbox()
        source.start(inbox)
        inbox.wait(lambda x: isinstance(x, Connection) and x.connected)
        assert source.can_control
        assert isinstance(inbox.items[0], History)
        inbox.wait(lambda x: isinstance(x, Status))
        # Steps 499-500 are already in the history; only 501-502 pass.
        engine.server.publish(Metrics(rows=[demo_row(s, __import__("random").Random(s), time.time()) for s in (499, 500, 501, 502)]))
        batch = inbox.wait(lambda x: isinstance(x, Metrics))
        assert [row[0] for row in batch.rows] == [501, 502]
        source.send(Command(id="t1", name="checkpoint"))
        inbox.wait(lambda x: getattr(x, "id", None) == "t1")
        assert engine.names() == [("checkpoint", None)]
        source.close()


def test_live_source_backfills_dropped_rows_from_the_store(tmp_path):
    run_dir = make_run(tmp_path, steps=500, status="running")
    with FakeEngine(run_dir, step=500) as engine:
        source, inbox = LiveSource(run_dir), Inbox()
        source.start(inbox)
        inbox.wait(lambda x: isinstance(x, Connection) and x.connected)
        # Steps 501-510 reached the store but not this client; 511 arrives saying so.
        import random

        rng = random.Random(0)
        writer = StoreWriter(run_dir / STORE_NAME)
        writer.write(rows=[demo_row(s, rng, time.time()) for s in range(501, 511)])
        writer.close()
        engine.server.publish(Metrics(rows=[demo_row(511, rng, time.time())], dropped=10))
        backfill = inbox.wait(lambda x: isinstance(x, Backfill) and "loss" in x.series)
        steps, _ = backfill.series["loss"]
        assert steps == list(range(501, 511))
        source.close()


def test_live_source_reports_disconnect_and_final_status(tmp_path):
    run_dir = make_run(tmp_path, steps=100, status="running")
    engine = FakeEngine(run_dir, step=100).__enter__()
    source, inbox = LiveSource(run_dir), Inbox()
    source.start(inbox)
    inbox.wait(lambda x: isinstance(x, Connection) and x.connected)
    engine.server.stop()
    inbox.wait(lambda x: isinstance(x, Connection) and x.note == "engine disconnected")
    assert not source.can_control
    rundir.update_info(run_dir, status="finished", exit_code=0, step=100)
    final = inbox.wait(lambda x: isinstance(x, Status) and x.state == "finished")
    assert final.exit_code == 0 and final.step == 100
    source.close()


def test_live_source_on_an_ended_run_does_not_wait(tmp_path):
    run_dir = make_run(tmp_path, steps=50, status="finished", exit_code=0)
    source, inbox = LiveSource(run_dir), Inbox()
    start = time.monotonic()
    source.start(inbox)
    note = inbox.wait(lambda x: isinstance(x, Connection))
    assert note.note == "engine not running" and time.monotonic() - start < 3
    inbox.wait(lambda x: isinstance(x, Status) and x.state == "finished")
    source.close()


def test_dead_engine_process_counts_as_crashed(tmp_path, monkeypatch):
    monkeypatch.setattr(source_mod, "GONE_GRACE_S", 0.1)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    run_dir = make_run(tmp_path, steps=50, status="running")
    rundir.update_info(run_dir, pid=dead.pid)
    source, inbox = LiveSource(run_dir), Inbox()
    source.start(inbox)
    crashed = inbox.wait(lambda x: isinstance(x, Status) and x.state == "crashed", timeout=8)
    assert "exited without recording" in crashed.detail
    source.close()


def test_log_tail_follows_lines(tmp_path):
    path = tmp_path / "output.log"
    tail = LogTail(path, max_bytes=20)
    assert tail.read() == []
    path.write_bytes(b"a line that is long\nsecond\nthi")
    assert tail.read() == ["second"]  # only the last 20 bytes, first partial line dropped
    with open(path, "ab") as f:
        f.write(b"rd\nprogress 10%\rprogress 50%\r\n")
    assert tail.read() == ["third", "progress 50%"]
    path.write_bytes(b"new\n")  # truncated and rewritten
    assert tail.read() == ["new"]
    with open(path, "ab") as f:
        f.write("caf\u00e9 \xff\n".encode("utf-8") + b"\xff\n")
    assert tail.read() == ["café ÿ", "\ufffd"]


@pytest.mark.parametrize("info, state", [({"status": "weird"}, "starting"), ({"status": "paused", "paused_at": 7}, "paused")])
def test_status_from_files(info, state):
    status = source_mod.status_from_files(info, 12)
    assert status.state == state and status.step == 12
