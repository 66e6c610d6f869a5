"""The training doctor: every planted bug raises exactly its finding through the real CLI,
the demo, the examples and the other test scripts raise none, and `ptdash doctor` prints
what a run found.

The runs the selected tests need start together, a few at a time, at the first test that
needs one, so that their interpreter start-ups overlap; each test waits only for its own.
(tests/scripts/ddp_train.py is left out: two ranks cost as much as all the rest together.)
"""

from __future__ import annotations

import io
import shutil
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from ptdash.shared import rundir
from ptdash.shared.reader import StoreReader
from support.runner import ENV, REPO, SCRIPTS, ptdash

DOCTOR = SCRIPTS / "doctor"
EXAMPLES = REPO / "examples"
WARNINGS_ON = {k: v for k, v in ENV.items() if k != "PYTHONWARNINGS"}
TINY_DEMO = ("--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--batch-size", "8", "--block-size", "32",
             "--log-every", "25")

PLANTED = {
    "loop_bugs": ((str(DOCTOR / "loop_bugs.py"),), WARNINGS_ON),
    "zero_before_step": ((str(DOCTOR / "zero_before_step.py"),), ENV),
    "lr_zero_plateau": ((str(DOCTOR / "lr_zero_plateau.py"),), ENV),
    "slow_data": ((str(SCRIPTS / "slow_data.py"),), ENV),
}
CLEAN = {
    "demo": (("demo", "--steps", "50", *TINY_DEMO), ENV),
    "basic": ((str(EXAMPLES / "basic.py"), "--steps", "60"), ENV),
    "grad_accum": ((str(EXAMPLES / "grad_accum.py"), "--steps", "60"), ENV),
    "lbfgs": ((str(EXAMPLES / "lbfgs.py"), "--steps", "8"), ENV),
    "closure_accum": ((str(SCRIPTS / "closure_accum.py"),), ENV),
    "steady": ((str(SCRIPTS / "steady.py"), "--steps", "60", "--sleep", "0"), ENV),
    "plant_nan": (("--on-anomaly", "skip", str(SCRIPTS / "plant_nan.py")), ENV),
    "oom": ((str(SCRIPTS / "oom.py"),), ENV),
    "amp_scaler": ((str(SCRIPTS / "amp_scaler.py"),), ENV),
}
NEEDS = {
    "test_loop_bugs_each_raise_their_finding_once": ["loop_bugs"],
    "test_zero_grad_between_backward_and_step": ["zero_before_step"],
    "test_lr_zero_and_loss_plateau": ["lr_zero_plateau"],
    "test_input_bound_names_the_dataloader_settings": ["slow_data"],
    "test_doctor_command_prints_the_findings": ["zero_before_step", "basic"],
}
"""The runs each test reads (besides the parametrized clean ones, named by their `name`)."""


def _run(where: Path, args: tuple, env: dict):
    where.mkdir()
    result = ptdash("--headless", "--run-dir", "run", *args, cwd=where, env=env, timeout=300)
    return where / "run", result


class _Runs:
    """Runs by name, started on a small pool; a run no test asked for never starts."""

    def __init__(self, root: Path) -> None:
        self.root, self.pool, self.futures = root, ThreadPoolExecutor(max_workers=3), {}

    def start(self, name: str) -> Future:
        if name not in self.futures:
            args, env = {**PLANTED, **CLEAN}[name]
            self.futures[name] = self.pool.submit(_run, self.root / name, args, env)
        return self.futures[name]

    def __getitem__(self, name: str) -> Future:
        return self.start(name)


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory):
    found = _Runs(tmp_path_factory.mktemp("doctor"))
    for item in request.session.items:
        if item.module is request.module:
            params = getattr(getattr(item, "callspec", None), "params", {})
            for name in NEEDS.get(item.originalname, []) + ([params["name"]] if "name" in params else []):
                found.start(name)
    yield found
    for future in found.futures.values():
        future.cancel()
    found.pool.shutdown(wait=True)


def _events(run_dir: Path, kind: str) -> list[dict]:
    with StoreReader(run_dir / "metrics.db") as s:
        return [e for e in s.events() if e.kind == kind]


def _findings(runs, name: str) -> dict[str, list[dict]]:
    run_dir, result = runs[name].result()
    assert (run_dir / "metrics.db").exists(), result.stdout[-3000:] + result.stderr[-3000:]
    found: dict[str, list[dict]] = {}
    for e in _events(run_dir, "finding"):
        found.setdefault(e.data["id"], []).append(e.data)
    return found


def test_loop_bugs_each_raise_their_finding_once(runs):
    found = _findings(runs, "loop_bugs")
    assert sorted(found) == ["dataparallel", "grads-never-cleared", "inplace-autograd", "never-learns",
                             "sampler-no-set-epoch", "train-in-eval-mode"]
    for rule, items in found.items():
        assert all(d["what"] and d["why"] and d["fix"] for d in items), rule
        assert len(items) == (2 if rule == "never-learns" else 1), items
    (cleared,) = found["grads-never-cleared"]
    assert cleared["source"].endswith("loop_bugs.py:36") and cleared["step"] == 2 and cleared["param"] == "body.0.weight"
    (eval_mode,) = found["train-in-eval-mode"]
    assert "1 Dropout" in eval_mode["what"] and eval_mode["source"].endswith("loop_bugs.py:29")
    cases = {d["case"]: d for d in found["never-learns"]}
    assert cases["no-grad"]["params"] == ["unused.weight", "unused.bias"]
    assert cases["frozen"]["params"] == ["scale"]
    assert found["sampler-no-set-epoch"][0]["source"].endswith("loop_bugs.py:33")
    assert found["dataparallel"][0]["module"] == "Net"
    (inplace,) = found["inplace-autograd"]
    assert inplace["source"].endswith("loop_bugs.py:44") and "Sigmoid" in inplace["node"]
    assert "--detect-anomaly" in inplace["fix"]
    (warning,) = [e for e in _events(runs["loop_bugs"].result()[0], "warning") if e.data.get("origin") == "python"]
    assert "planted warning from the script" in warning.message and warning.data["source"].endswith(":39")


def test_zero_grad_between_backward_and_step(runs):
    found = _findings(runs, "zero_before_step")
    assert list(found) == ["zero-grad-before-step"]
    (finding,) = found["zero-grad-before-step"]
    assert finding["step"] == 1 and finding["source"].endswith("zero_before_step.py:11")
    assert "no gradients" in finding["what"]


def test_lr_zero_and_loss_plateau(runs):
    found = _findings(runs, "lr_zero_plateau")
    assert sorted(found) == ["loss-plateau", "lr-zero"]
    assert found["lr-zero"][0]["groups"] == [1] and found["lr-zero"][0]["step"] == 1
    plateau = found["loss-plateau"][0]
    assert plateau["stale_steps"] >= 500 and plateau["step"] <= 600


def test_input_bound_names_the_dataloader_settings(runs):
    found = _findings(runs, "slow_data")
    assert list(found) == ["input-bound"]
    (finding,) = found["input-bound"]
    assert finding["num_workers"] == 0 and finding["data_share"] > 0.5
    assert finding["source"].endswith("slow_data.py:20") and "num_workers=" in finding["fix"]


@pytest.mark.parametrize("name", list(CLEAN))
def test_clean_scripts_raise_no_finding(runs, name):
    run_dir, result = runs[name].result()
    assert result.returncode == (1 if name == "oom" else 0), result.stdout[-3000:]
    assert _findings(runs, name) == {}


def test_doctor_command_prints_the_findings(runs):
    from ptdash.tui.doctor_cli import cmd_doctor

    run_dir, _ = runs["zero_before_step"].result()
    out = io.StringIO()
    with redirect_stdout(out):
        code = cmd_doctor([str(run_dir)])
    text = out.getvalue()
    assert code == 1
    assert "zero-grad-before-step" in text and "why:" in text and "fix:" in text and "zero_before_step.py:11" in text

    clean_dir, _ = runs["basic"].result()
    out = io.StringIO()
    with redirect_stdout(out):
        assert cmd_doctor([str(clean_dir)]) == 0
    assert "no findings" in out.getvalue()


def test_doctor_command_errors_are_one_line(tmp_path):
    from ptdash.tui.doctor_cli import cmd_doctor

    err = io.StringIO()
    run_dir = rundir.create(tmp_path, "run", exact=True)  # a run.json, but no store yet
    with redirect_stderr(err):
        assert cmd_doctor([str(run_dir)]) == 1
    assert err.getvalue().count("\n") == 1 and "metrics" in err.getvalue()
    err = io.StringIO()
    (tmp_path / "damaged").mkdir()
    (tmp_path / "damaged" / "run.json").write_text('{"id": "x", "name": "x"}')
    with redirect_stderr(err):
        assert cmd_doctor([str(tmp_path / "damaged")]) == 1
    assert err.getvalue().count("\n") == 1 and "run.json is damaged" in err.getvalue()
    with redirect_stderr(io.StringIO()), redirect_stdout(io.StringIO()):
        assert cmd_doctor(["a", "b"]) == 2


def _has_cuda() -> bool:
    if shutil.which("nvidia-smi") is None:  # spares CPU machines importing torch here
        return False
    import torch

    return torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _has_cuda(), reason="needs a CUDA device")
def test_host_syncs_on_gpu(tmp_path):
    result = ptdash("--headless", "--run-dir", "run", str(DOCTOR / "host_syncs.py"), cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:]
    found = {e.data["id"]: e.data for e in _events(tmp_path / "run", "finding")}
    assert list(found) == ["host-syncs"]
    assert found["host-syncs"]["source"].endswith("host_syncs.py:14")
    assert found["host-syncs"]["lines"][0]["per_step"] == 1
    # Sampling hid its own warnings from the script's output.
    assert "synchronizing" not in result.stdout
    # A script that sets the sync debug mode itself is left alone, and syncs nothing.
    result = ptdash("--headless", "--run-dir", "clean", str(SCRIPTS / "cuda_sync_free.py"), cwd=tmp_path, timeout=300)
    assert result.returncode == 0 and _events(tmp_path / "clean", "finding") == [], result.stdout[-3000:]


# ----------------------------------------------------------- in-process rule checks
# The loop shapes a detector must tell apart, driven the way the engine's hooks drive
# the doctor (backward, zero_grad, pre/post step, flush), with a tiny CPU model.






























def test_doctor_command_imports_neither_torch_nor_textual():
    import subprocess
    import sys

    code = "import sys, ptdash.tui.doctor_cli; print('torch' in sys.modules, 'textual' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
