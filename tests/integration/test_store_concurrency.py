"""The store read while another process writes it, and after that process died mid-write."""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap
import time

from ptdash.shared.reader import StoreReader
from ptdash.shared.store import StoreError, StoreWriter

STORE = "metrics.db"

WRITER = textwrap.dedent("""
    import sys, time
    from ptdash.shared.protocol import Event
    from ptdash.shared.store import StoreWriter
    path, flushes, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    writer = StoreWriter(path)
    for f in range(flushes):
        rows = [[s, float(s), {n: float(s * (i + 1)) for i, n in enumerate(("a", "b", "c", "d"))}]
                for s in range(f * size + 1, (f + 1) * size + 1)]
        writer.write(rows=rows, events=[Event(kind="flush", step=f * size, wall=float(f), message=f"flush {f}", data={"n": f})])
        time.sleep(0.002)
    writer.close()
""")


def test_a_store_read_while_written_shows_only_whole_flushes(tmp_path):
    path, size = tmp_path / STORE, 50
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path), "600", str(size)])
    try:
        reads = 0
        seen_partial = False
        while proc.poll() is None or reads == 0:
            try:
                reader = StoreReader(path)
            except StoreError:
                time.sleep(0.01)
                continue
            with reader:
                for i, name in enumerate(("a", "b", "c", "d")):
                    steps, values = reader.series(name)
                    assert len(steps) % size == 0 and steps == list(range(1, len(steps) + 1))
                    assert values == [float(s * (i + 1)) for s in steps]
                    seen_partial |= 0 < len(steps) < 600 * size
                    steps, values = reader.series(name, max_points=40)
                    assert all(v == float(s * (i + 1)) for s, v in zip(steps, values))
                    if steps:
                        assert steps[-1] % size == 0  # the newest point closes a whole flush
                wsteps, walls = reader.walls()
                assert len(wsteps) % size == 0 and walls == [float(s) for s in wsteps]
                events = reader.events()
                assert [e.data["n"] for e in events] == list(range(len(events)))
                assert reader.damage is None
            reads += 1
        assert proc.wait() == 0
        assert seen_partial and reads > 5
    finally:
        proc.kill()
        proc.wait()


def test_a_cut_write_ahead_log_reads_as_the_last_whole_flush(tmp_path):
    """A crash mid-write leaves a torn WAL: readers see the flushes committed before it."""
    live = tmp_path / "live"
    live.mkdir()
    writer = StoreWriter(live / STORE)
    writer._db.execute("PRAGMA wal_autocheckpoint=0")  # keep every flush in the WAL for this test
    size = 40
    for f in range(60):
        writer.write(rows=[[s, float(s), {"a": float(s), "b": -float(s)}] for s in range(f * size + 1, (f + 1) * size + 1)])
    wal = (live / f"{STORE}-wal").read_bytes()
    db_bytes = (live / STORE).read_bytes()
    rng = random.Random(7)
    counts = []
    for cut in sorted(rng.sample(range(32, len(wal)), 25)) + [len(wal)]:
        d = tmp_path / f"cut{cut}"
        d.mkdir()
        (d / STORE).write_bytes(db_bytes)
        (d / f"{STORE}-wal").write_bytes(wal[:cut])
        with StoreReader(d / STORE) as reader:
            steps, values = reader.series("a")
            wsteps, _ = reader.walls()
            assert reader.damage is None
        assert steps == wsteps == list(range(1, len(steps) + 1)) and len(steps) % size == 0
        assert values == [float(s) for s in steps]
        counts.append(len(steps))
    assert counts == sorted(counts) and counts[-1] == 60 * size and len(set(counts)) > 5
    writer.close()
