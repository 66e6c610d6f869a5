"""What tests/scripts/ddp_printed.py's two ranks must leave in a run, however they were launched."""

from __future__ import annotations

from pathlib import Path

from ptdash.shared import names
from ptdash.shared.reader import StoreReader

STEPS = (5, 10, 15, 20)


def each_ranks_printed(run_dir: Path, output: str | None = None) -> None:
    """Each rank's own ``val_loss`` at steps 5-20 (rank R printed R + step / 100), each
    rank's first value an event of its own at step 5, every line in the output as written
    (``output``: output.log's by default)."""
    with StoreReader(run_dir / "metrics.db") as store:
        for rank in (0, 1):
            assert store.series(names.printed("val_loss"), rank=rank) == \
                (list(STEPS), [rank + step / 100 for step in STEPS]), rank
        found = sorted((e.rank, e.step) for e in store.events(kind="printed"))
    assert found == [(0, 5), (1, 5)]  # each rank's first value, said once
    lines = (run_dir / "output.log").read_text().splitlines() if output is None else output.splitlines()
    assert sorted(line for line in lines if line.startswith("rank ")) == sorted(
        f"rank {r} | val_loss={r + s / 100}" for r in (0, 1) for s in STEPS)
