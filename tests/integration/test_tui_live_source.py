"""LiveSource against a real control socket (``support.recorded_run.FakeEngine``, the real
``transport.Server``) and real processes: relaying without duplicates, backfilling dropped
rows, following the files once the engine is gone, and a dead engine counted as crashed."""

from __future__ import annotations

import random
import subprocess
import sys
import time

from ptdash.shared import rundir
from ptdash.shared.protocol import Command, LayerNames, Metrics, Status
from ptdash.shared.store import STORE_NAME, StoreWriter
from ptdash.tui.source import Backfill, Connection, History, InfoChanged
from ptdash.tui.source import live as live_mod
from ptdash.tui.source.live import LiveSource
from support.inbox import Inbox
from support.recorded_run import FakeEngine, demo_row, make_ddp_run, make_run

KILLED = dict(status="crashed", exit_code=-9, rank_failures=[{"rank": 1, "exitcode": -9}, {"rank": 0, "exitcode": -15}],
              detail="rank 1 killed by SIGKILL; the launcher then stopped rank 0")


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
        engine.server.publish(Metrics(rows=[demo_row(s, random.Random(s), time.time()) for s in (499, 500, 501, 502)]))
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


def test_live_source_on_an_ended_run_does_not_wait(tmp_path, monkeypatch):
    # Were it to wait for the engine, it would wait past the inbox's deadline.
    monkeypatch.setattr(LiveSource, "CONNECT_WAIT_S", 3600.0)
    run_dir = make_run(tmp_path, steps=50, status="finished", exit_code=0)
    source, inbox = LiveSource(run_dir), Inbox()
    source.start(inbox)
    note = inbox.wait(lambda x: isinstance(x, Connection))
    assert note.note == "engine not running"
    inbox.wait(lambda x: isinstance(x, Status) and x.state == "finished")
    source.close()


def test_dead_engine_process_counts_as_crashed(tmp_path, monkeypatch):
    monkeypatch.setattr(live_mod, "GONE_GRACE_S", 0.1)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    run_dir = make_run(tmp_path, steps=50, status="running")
    rundir.update_info(run_dir, pid=dead.pid)
    source, inbox = LiveSource(run_dir), Inbox()
    source.start(inbox)
    crashed = inbox.wait(lambda x: isinstance(x, Status) and x.state == "crashed", timeout=8)
    assert "exited without recording" in crashed.detail
    source.close()


def test_a_dashboard_that_connects_later_is_sent_the_names(tmp_path):
    run_dir = make_run(tmp_path, steps=40, layers=20)
    names = LayerNames(step=41, names=[f"w{i}" for i in range(20)], shapes=[[2]] * 20)
    with FakeEngine(run_dir, step=40, layer_names=names):
        inbox = Inbox()
        source = LiveSource(run_dir)
        source.start(inbox)
        try:
            assert inbox.wait(lambda x: isinstance(x, LayerNames)) == names
        finally:
            source.close()


def test_source_waits_for_the_launcher_to_name_the_failed_rank(tmp_path):
    """Rank 0's engine records the crash first; the launcher names the failed ranks after."""
    launcher = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        run_dir = make_ddp_run(tmp_path, steps=20, findings=False, status="crashed", pid=None,
                               launcher_pid=launcher.pid)
        inbox = Inbox()
        source = LiveSource(run_dir)
        source.start(inbox)
        inbox.wait(lambda x: isinstance(x, Status) and x.state == "crashed")
        time.sleep(1.2)  # the source keeps following run.json while the launcher runs
        rundir.update_info(run_dir, **KILLED)
        launcher.kill()
        info = inbox.wait(lambda x: isinstance(x, InfoChanged) and x.info.rank_failures, timeout=10).info
        assert info.detail == KILLED["detail"] and info.world_size == 2
        inbox.wait(lambda x: isinstance(x, Status) and x.exit_code == -9)
        source.close()
    finally:
        launcher.kill()
        launcher.wait()
