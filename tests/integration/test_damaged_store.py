"""A store damaged in its middle, through the real CLI: ``export`` writes everything around
the damaged page, and ``show --once`` and ``doctor`` name the damage as ``export`` meets it
instead of presenting a healthy run (issue 41, item 8)."""

from __future__ import annotations

import csv
import random
import re
import sqlite3

import pytest

from ptdash.shared.store import STORE_NAME
from support.recorded_run import make_run
from support.runner import ptdash

STEPS = 3000
PAGE = 4096


def _exported(root, run_dir, name: str):
    result = ptdash("export", str(run_dir), "--format", "csv", "-o", name, cwd=root)
    with open(root / name, newline="") as f:
        rows = list(csv.DictReader(f))
    return result, rows


def _damage_a_middle_page(path) -> int:
    """Overwrite, with random bytes, a leaf page of the scalars table in the middle of the
    store; the page's number."""
    with sqlite3.connect(path) as db:
        leaves = [p for (p,) in db.execute(
            "SELECT pageno FROM dbstat WHERE name = 'scalars' AND pagetype = 'leaf' ORDER BY pageno")]
    page = leaves[len(leaves) // 2]
    data = bytearray(path.read_bytes())
    data[(page - 1) * PAGE:page * PAGE] = random.Random(41).randbytes(PAGE)
    path.write_bytes(bytes(data))
    return page


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("damaged")
    now = 1_796_000_000.0  # one clock for both: the same rows, byte for byte
    healthy = make_run(root / "healthy", steps=STEPS, status="finished", exit_code=0, now=now)
    damaged = make_run(root / "damaged", steps=STEPS, status="finished", exit_code=0, now=now)
    with sqlite3.connect(damaged / STORE_NAME) as db:
        assert db.execute("PRAGMA page_size").fetchone()[0] == PAGE
    _damage_a_middle_page(damaged / STORE_NAME)
    return root, healthy, damaged


def test_export_reads_around_a_damaged_middle(runs):
    root, healthy, damaged = runs
    result, whole = _exported(root, healthy, "healthy.csv")
    assert result.returncode == 0 and len(whole) == STEPS, result.stderr
    result, rows = _exported(root, damaged, "damaged.csv")
    assert result.returncode == 1
    said = [line for line in result.stderr.splitlines() if line.startswith("ptdash: warning:")]
    assert len(said) == 1 and "metrics.db is damaged in its scalars at step" in said[0], result.stderr
    assert "left out" in said[0]
    # Before: 0 of 3,000 steps. Now every step is there, and every value read is the
    # healthy store's (the same seed wrote both): the damaged page's cells are empty.
    by_step = {row["step"]: row for row in whole}
    assert len(rows) >= STEPS - 300 and rows[-1]["step"] == str(STEPS)
    missing = 0
    for row in rows:
        for column, value in row.items():
            if value != "":
                assert value == by_step[row["step"]][column], (row["step"], column)
            elif by_step[row["step"]][column] != "":
                missing += 1
    first, values = re.search(r"at step (\d+).*?([\d,]+) step\(s\) of series", said[0]).groups()
    assert 0 < missing <= int(values.replace(",", "")) < STEPS
    assert int(first) > 1


def test_show_once_and_doctor_report_the_damage_as_export_meets_it(runs):
    root, healthy, damaged = runs
    export = _exported(root, damaged, "again.csv")[0].stderr
    where = re.search(r"metrics\.db is damaged in its scalars at step \d+", export).group(0)

    shown = ptdash("show", str(damaged), "--once", cwd=root)
    assert shown.returncode == 1, shown.stdout + shown.stderr
    (line,) = [line for line in shown.stdout.splitlines() if line.strip().startswith("damage")]
    assert where in line and "ptdash export writes everything else" in line
    as_json = ptdash("show", str(damaged), "--once", "--json", cwd=root)
    assert as_json.returncode == 1 and where in as_json.stdout

    doctor = ptdash("doctor", str(damaged), cwd=root)
    assert doctor.returncode == 1
    assert f"The run's history is damaged: {where}" in doctor.stdout, doctor.stdout

    # A whole store: no damage line, exit 0 (the check is not an alarm on a healthy run).
    shown = ptdash("show", str(healthy), "--once", cwd=root)
    assert shown.returncode == 0 and "  damage " not in shown.stdout, shown.stdout
    doctor = ptdash("doctor", str(healthy), cwd=root)
    assert doctor.returncode == 0 and "history is damaged" not in doctor.stdout, doctor.stdout
