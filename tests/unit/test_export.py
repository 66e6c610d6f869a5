"""The export's streaming: its memory does not grow with the run's length.

Two synthetic stores, one four times as long as the other, are exported to CSV in
windows of 256 steps; the peak of the memory Python allocates during the export
(tracemalloc) must be the same within a margin, where reading a series whole would
make it four times as large.
"""

from __future__ import annotations

import argparse
import csv
import random
import tracemalloc

from ptdash.shared import rundir
from ptdash.shared.store import STORE_NAME, StoreWriter
from ptdash.tui.export import Progress, cmd_export, write_jsonl
from support.recorded_run import demo_row

WINDOW = 256


def synthetic_run(root, steps: int):
    run_dir = rundir.create(root, f"len{steps}", exact=True, argv=["train.py"])
    rng = random.Random(0)
    writer = StoreWriter(run_dir / STORE_NAME)
    for first in range(1, steps + 1, 500):
        writer.write(rows=[demo_row(s, rng, 1e9 + s) for s in range(first, min(steps, first + 499) + 1)])
    writer.close()
    return run_dir


def export_peak(run_dir, out) -> int:
    args = argparse.Namespace(run=str(run_dir), format="csv", output=str(out), layers=False, events=False,
                              samples=False)
    tracemalloc.start()
    try:
        assert cmd_export(args, window=WINDOW) == 0
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_csv_export_memory_does_not_grow_with_the_run(tmp_path, capsys):
    short, long = synthetic_run(tmp_path, 4_000), synthetic_run(tmp_path, 16_000)
    export_peak(short, tmp_path / "warm.csv")  # first-use allocations (imports, caches) out of the way
    small = export_peak(short, tmp_path / "short.csv")
    large = export_peak(long, tmp_path / "long.csv")
    with open(tmp_path / "long.csv") as f:
        assert sum(1 for _ in csv.reader(f)) == 16_001
    assert large < 1.5 * small, f"peak {large / 1e6:.2f} MB for 16k steps vs {small / 1e6:.2f} MB for 4k"
    assert "wrote" in capsys.readouterr().err


def test_progress_lines_without_a_terminal(tmp_path):
    class Stream:
        def __init__(self):
            self.text = ""

        def isatty(self):
            return False

        def write(self, text):
            self.text += text

        def flush(self):
            pass

    stream = Stream()
    progress = Progress("run", 100, stream=stream, every=0.0)  # a report at every row
    assert [r[0] for r in progress.follow([(1, 0.0, []), (51, 0.0, []), (100, 0.0, [])])] == [1, 51, 100]
    progress.done("wrote x")
    lines = stream.text.splitlines()
    assert "step 51 of 100 (51%)" in lines[1] and lines[-1] == "[ptdash] wrote x" and "\x1b" not in stream.text


def test_jsonl_puts_each_event_after_its_step(tmp_path):
    import io
    import json

    from ptdash.shared.protocol import Event
    from ptdash.shared.rows import Column

    out = io.StringIO()
    events = [Event(kind="checkpoint", step=2, wall=1.0, message="saved", id=1),
              Event(kind="command", step=1, wall=0.5, message="clip: 1 -> 0.5", id=2,
                    data={"id": "c1", "name": "clip", "value": 0.5, "ok": True, "applied_step": 1})]
    rows = [(1, 0.1, [1.5]), (2, 0.2, [None]), (3, 0.3, [1.25])]
    write_jsonl(out, [Column("loss", 0, "loss")], rows, events)
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [next(iter(x)) for x in lines] == ["step", "command", "step", "event", "step"]
    assert lines[1]["command"] == "clip" and lines[1]["value"] == 0.5 and lines[1]["applied_step"] == 1
    assert lines[2] == {"step": 2, "wall": 0.2}  # a value that is not there is left out
