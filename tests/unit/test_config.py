"""RunConfig and RunInfo: validated on construction, round-tripped through run.json, and read
tolerantly from a file another version (or a person) wrote."""

from __future__ import annotations

import json
import math

import pytest

from ptdash.shared import rundir
from ptdash.shared.config import ConfigError, RunConfig, RunInfo


def test_defaults_are_the_clis_defaults():
    config = RunConfig()
    assert config.on_anomaly == "pause" and config.update_ratio_every == 100 and config.clip is None
    assert config.overhead_budget == 1.0
    assert RunConfig.from_json(config.to_json()) == config


@pytest.mark.parametrize("field, value", [
    ("clip", -1.0), ("clip", math.nan), ("clip", math.inf), ("clip", "abc"), ("lr_scale", 0.0),
    ("keep_last", 0), ("keep_last", -3), ("checkpoint_every", 0), ("update_ratio_every", -1),
    ("stall_seconds", 0.0), ("flush_interval", -0.1), ("on_anomaly", "explode"), ("profile_steps", (5, 2)),
    ("profile_steps", (0, 3)), ("memory_history", "yes"), ("keep_last", True),
    ("overhead_budget", 0.0), ("overhead_budget", -1.0), ("overhead_budget", 101.0), ("overhead_budget", math.nan),
])
def test_bad_values_are_refused_in_one_line_naming_the_field(field, value):
    with pytest.raises(ConfigError) as caught:
        RunConfig(**{field: value})
    message = str(caught.value)
    assert field in message and "\n" not in message


def test_from_json_ignores_keys_it_does_not_know_and_refuses_bad_known_ones():
    assert RunConfig.from_json({"clip": 2, "from_a_newer_version": 1}).clip == 2.0
    with pytest.raises(ConfigError):
        RunConfig.from_json({"clip": -2})
    with pytest.raises(ConfigError):
        RunConfig.from_json(["not", "an", "object"])
    assert RunConfig.from_json({"profile_steps": [3, 4]}).profile_steps == (3, 4)


def test_run_json_round_trips_through_the_one_writer(tmp_path):
    config = RunConfig(clip=0.5, keep_last=2, profile_steps=(3, 5))
    run_dir = rundir.create(tmp_path, "train", argv=["train.py", "--lr", "3e-4"], config=config)
    info = rundir.read_info(run_dir)
    assert info.config == config and info.argv == ["train.py", "--lr", "3e-4"] and info.status == "starting"
    assert info.run_dir == str(run_dir.resolve()) and info.socket.endswith(f"{info.id}.sock")
    updated = rundir.update_info(run_dir, status="paused", paused_at=12, total_steps=100, clip=0.25)
    assert rundir.read_info(run_dir) == updated and updated.paused_at == 12
    with pytest.raises(TypeError):
        rundir.update_info(run_dir, steps=3)  # not a run.json field: a typo cannot write a key nobody reads


def test_a_field_of_the_wrong_type_reads_as_missing(tmp_path):
    run_dir = rundir.create(tmp_path, "train")
    data = json.loads((run_dir / "run.json").read_text())
    data.update(pid="12", step=True, total_steps=50, exit_code=None, config={"clip": "x"}, status="weird")
    (run_dir / "run.json").write_text(json.dumps(data))
    info = rundir.read_info(run_dir)
    assert info.pid is None and info.step is None and info.total_steps == 50 and info.config == RunConfig()
    assert info.status == "starting"


def test_a_run_json_without_identity_or_not_json_is_a_clear_error(tmp_path):
    run_dir = rundir.create(tmp_path, "train")
    (run_dir / "run.json").write_text("{\"name\": \"x\"}")
    with pytest.raises(ValueError, match="lacks id"):
        rundir.read_info(run_dir)
    (run_dir / "run.json").write_text("{not json")
    with pytest.raises(ValueError, match="damaged"):
        rundir.read_info(run_dir)
    with pytest.raises(FileNotFoundError, match="not a ptdash run"):
        rundir.read_info(tmp_path / "nowhere")


def test_run_info_refuses_an_unknown_status():
    with pytest.raises(ConfigError):
        RunInfo(id="x", name="n", run_dir="/r", socket="/s", status="weird")
