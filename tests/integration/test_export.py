"""``ptdash export`` end to end: a real run through the real CLI, read back by the tools people use.

CSV with the csv module, JSON lines with json, TensorBoard with TensorBoard's own
EventAccumulator; every loss must come back exactly as the script saw it.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest

from support.runner import ENV, REPO, ptdash

STEPS = 40


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    """A finished 40-step run of examples/basic.py, and the losses the script itself wrote."""
    root = tmp_path_factory.mktemp("export")
    loss_file = root / "losses.txt"
    result = ptdash("--headless", "--run-dir", "run", str(REPO / "examples" / "basic.py"),
                    "--steps", str(STEPS), "--loss-file", str(loss_file), cwd=root)
    assert result.returncode == 0, result.stdout + result.stderr
    losses = [float(line) for line in loss_file.read_text().split()]
    assert len(losses) == STEPS
    return root, root / "run", losses


def test_csv_carries_every_loss_exactly(real_run):
    root, run_dir, losses = real_run
    result = ptdash("export", str(run_dir), "--format", "csv", "-o", "run.csv", cwd=root)
    assert result.returncode == 0, result.stderr
    assert f"wrote run.csv: {STEPS} steps" in result.stderr and not result.stdout
    with open(root / "run.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows] == list(range(1, STEPS + 1))
    assert [float(r["loss"]) for r in rows] == losses
    assert all(float(r["opt/lr/group0"]) > 0 and float(r["wall"]) > 0 for r in rows)
    assert not list(root.glob(".run.csv.*"))  # the temporary file was renamed into place


def test_csv_to_stdout_and_layers(real_run):
    root, run_dir, losses = real_run
    result = ptdash("export", str(run_dir), "--format", "csv", "--layers", cwd=root)
    assert result.returncode == 0, result.stderr
    rows = list(csv.DictReader(result.stdout.splitlines()))
    assert [float(r["loss"]) for r in rows if r["loss"]] == losses
    layer_columns = [c for c in rows[0] if c.startswith("layer/")]
    assert "layer/0.weight/grad_norm" in layer_columns and "layer/4.bias/update_ratio" in layer_columns
    assert any(r["layer/0.weight/grad_norm"] for r in rows)  # one record per flush: some steps have one


def test_jsonl_carries_every_loss_and_the_command_journal(real_run):
    root, run_dir, losses = real_run
    result = ptdash("export", str(run_dir), "--format", "jsonl", "--events", "-o", "run.jsonl", cwd=root)
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in (root / "run.jsonl").read_text().splitlines()]
    steps = [x for x in lines if "event" not in x and "command" not in x and "loss" in x]
    assert [x["step"] for x in steps] == list(range(1, STEPS + 1))
    assert [x["loss"] for x in steps] == losses
    events = [x for x in lines if "event" in x]
    assert {"event", "step", "wall", "message", "rank", "data"} <= set(events[0])
    assert any(x["event"] == "run" for x in events)
    plain = ptdash("export", str(run_dir), "--format", "jsonl", cwd=root)
    assert all("event" not in json.loads(line) for line in plain.stdout.splitlines())


def test_tensorboard_reads_every_loss_back(real_run):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    root, run_dir, losses = real_run
    result = ptdash("export", str(run_dir), "--format", "tensorboard", "-o", "tb", cwd=root)
    assert result.returncode == 0, result.stderr
    acc = EventAccumulator(str(root / "tb"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    assert {"loss", "opt/lr/group0", "grad/norm_total"} <= set(acc.Tags()["scalars"])
    read = acc.Scalars("loss")
    assert [e.step for e in read] == list(range(1, STEPS + 1))
    # TensorBoard keeps 32-bit floats; the loss of a float32 model is one, so nothing is lost.
    assert [e.value for e in read] == losses
    texts = [e.tensor_proto.string_val[0].decode() for e in acc.Tensors("events")]
    assert any(t.startswith("run: ") for t in texts)
    again = ptdash("export", str(run_dir), "--format", "tensorboard", "-o", "tb", cwd=root)
    assert again.returncode == 2 and "already holds TensorBoard event files" in again.stderr


def test_tensorboard_missing_is_a_one_line_hint(real_run, tmp_path):
    root, run_dir, _ = real_run
    # A tensorboard package that cannot be imported, ahead of the real one on the path.
    (tmp_path / "tensorboard").mkdir()
    (tmp_path / "tensorboard" / "__init__.py").write_text("raise ImportError('not here')\n")
    result = ptdash("export", str(run_dir), "--format", "tensorboard", cwd=root,
                    env={**ENV, "PYTHONPATH": str(tmp_path)})
    assert result.returncode == 1
    assert result.stderr.strip() == ("ptdash: error: the tensorboard export needs the tensorboard package: "
                                     "pip install 'ptdash[tensorboard]'")


def test_bad_export_arguments_are_one_line(real_run):
    root, run_dir, _ = real_run
    for args in (["--format", "xml"], [], ["--format", "csv", "--events"], ["--format", "csv", "--frob"]):
        result = ptdash("export", str(run_dir), *args, cwd=root)
        assert result.returncode == 2, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("ptdash: error: ")
    missing = ptdash("export", "no-such-run", "--format", "csv", cwd=root)
    assert missing.returncode == 1 and "no run matching 'no-such-run'" in missing.stderr


def test_the_tensorboard_export_never_loads_torch(real_run):
    """The terminal side never imports torch, and TensorBoard's writer (unlike torch.utils.tensorboard) needs none."""
    pytest.importorskip("tensorboard")
    root, run_dir, _ = real_run
    code = ("import sys\nfrom ptdash.tui.cli import main\n"
            f"code = main(['export', {str(run_dir)!r}, '--format', 'tensorboard', '-o', 'tb-no-torch'])\n"
            "print(code, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, env=ENV, timeout=120)
    assert out.stdout.split() == ["0", "False"], out.stdout + out.stderr


def test_the_readings_by_time_export_to_csv_jsonl_and_tensorboard(tmp_path):
    from ptdash.shared.reader import StoreReader
    from ptdash.shared.store import STORE_NAME
    from support.recorded_run import make_run

    run_dir = make_run(tmp_path, steps=120, status="finished", exit_code=0)
    with StoreReader(run_dir / STORE_NAME) as store:
        names = store.sampled_names()
        stored = {name: store.sampled(name) for name in names}
    walls = stored["host/rss_bytes"][0]
    assert len(walls) >= 5 and "host/cpu_pct" in names

    result = ptdash("export", str(run_dir), "--format", "csv", "--samples", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    rows = list(csv.DictReader(result.stdout.splitlines()))
    assert [float(r["wall"]) for r in rows] == walls and {r["rank"] for r in rows} == {"0"}
    for name in names:
        assert [float(r[name]) for r in rows] == stored[name][1]

    lines = [json.loads(x) for x in ptdash("export", str(run_dir), "--format", "jsonl", "--samples",
                                           cwd=tmp_path).stdout.splitlines()]
    readings = [x for x in lines if "sample" in x]
    assert [x["sample"] for x in readings] == walls
    assert [x["host/rss_bytes"] for x in readings] == stored["host/rss_bytes"][1]
    order = [x["sample"] if "sample" in x else x["wall"] for x in lines]
    assert order == sorted(order)  # each reading among the steps, in time order
    assert len([x for x in lines if "step" in x]) == 120

    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert ptdash("export", str(run_dir), "--format", "tensorboard", "-o", "tb", cwd=tmp_path).returncode == 0
    acc = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    rss = acc.Scalars("host/rss_bytes")
    assert [e.wall_time for e in rss] == pytest.approx(walls)
    assert [e.value for e in rss] == pytest.approx(stored["host/rss_bytes"][1], rel=1e-6)
    steps = [e.step for e in rss]
    assert steps == sorted(steps) and steps[-1] <= 120
