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

from ptdash.store import StoreReader
from runner import ENV, REPO, SCRIPTS, ptdash

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
        return [e for e in s.events() if e["kind"] == kind]


def _findings(runs, name: str) -> dict[str, list[dict]]:
    run_dir, result = runs[name].result()
    assert (run_dir / "metrics.db").exists(), result.stdout[-3000:] + result.stderr[-3000:]
    found: dict[str, list[dict]] = {}
    for e in _events(run_dir, "finding"):
        found.setdefault(e["data"]["id"], []).append(e["data"])
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
    (warning,) = [e for e in _events(runs["loop_bugs"].result()[0], "warning") if e["data"].get("origin") == "python"]
    assert "planted warning from the script" in warning["message"] and warning["data"]["source"].endswith(":39")


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
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run.json").write_text('{"id": "x", "name": "x"}')
    with redirect_stderr(err):
        assert cmd_doctor([str(tmp_path / "run")]) == 1
    assert err.getvalue().count("\n") == 1 and "metrics" in err.getvalue()
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
    found = {e["data"]["id"]: e["data"] for e in _events(tmp_path / "run", "finding")}
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


class _Engine:
    def __init__(self, config=None):
        import types

        self.config = config or {}
        self.hooks = types.SimpleNamespace(models=[], step=0, main=None)
        self.events = []

    def event(self, kind, message, **data):
        self.events.append({"kind": kind, "message": message, "data": data})

    def found(self):
        return [e["data"]["id"] for e in self.events if e["kind"] == "finding"]


def _loop(shape: str, steps: int = 8, config=None):
    import torch
    from ptdash.doctor import Doctor

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    engine = _Engine(config)
    doctor = Doctor(engine)
    doctor.attach()
    try:
        for step in range(1, steps + 1):
            micro = 4 if shape == "accumulate" else 1
            if shape == "discarded_backward":  # e.g. a GAN: another loss's backward reached these params
                doctor.on_backward()
                model(torch.randn(8, 4)).sum().backward()
            if shape in ("accumulate", "zero_first", "discarded_backward"):
                doctor.on_zero_grad(opt)
                opt.zero_grad()
            for _ in range(micro):
                loss = model(torch.randn(8, 4)).pow(2).mean()
                doctor.on_backward()
                loss.backward()
            if shape == "zero_between_keep":
                doctor.on_zero_grad(opt)
                opt.zero_grad(set_to_none=False)
            doctor.on_pre_step(opt, step, [p for p in model.parameters() if p.grad is not None])
            opt.step()
            doctor.on_post_step(opt, step)
            engine.hooks.models = [model]
            if shape == "module_zero_after":
                model.zero_grad()
            elif shape == "none_after":
                for p in model.parameters():
                    p.grad = None
            elif shape == "data_zero_after":
                for p in model.parameters():
                    p.grad.data.zero_()
            if shape == "zero_between_keep":
                norms = [float(p.grad.norm()) for p in model.parameters()]
                doctor.on_flush([], [_LayerRow(step, norms)])
        doctor.on_flush([], [])
    finally:
        doctor.detach()
    return engine


class _LayerRow:
    def __init__(self, step, norms):
        self.step, self.grad_norms, self.params = step, norms, []


@pytest.mark.parametrize("shape", ["zero_first", "accumulate", "module_zero_after", "none_after", "data_zero_after",
                                   "discarded_backward"])
def test_ways_of_clearing_gradients_raise_nothing(shape):
    assert _loop(shape).found() == []


def test_never_clearing_raises_grads_never_cleared_once():
    assert _loop("never").found() == ["grads-never-cleared"]


def test_zero_grad_keeping_zeros_between_backward_and_step_is_confirmed_at_the_flush():
    engine = _loop("zero_between_keep", steps=3)
    assert engine.found() == ["zero-grad-before-step"]
    (finding,) = [e["data"] for e in engine.events if e["kind"] == "finding"]
    assert "all-zero gradients" in finding["what"] and finding["step"] == 1


def test_detect_anomaly_is_switched_on_only_on_request_and_restored():
    import torch
    from ptdash.doctor import Doctor

    doctor = Doctor(_Engine({"detect_anomaly": True}))
    doctor.attach()
    try:
        assert torch.is_anomaly_enabled()
    finally:
        doctor.detach()
    assert not torch.is_anomaly_enabled()
    doctor = Doctor(_Engine())
    doctor.attach()
    assert not torch.is_anomaly_enabled()
    doctor.detach()


def test_plateau_ignores_noise_on_a_falling_loss_and_flags_a_flat_one():
    import random

    from ptdash.doctor_rules import Plateau

    rng = random.Random(0)
    falling = Plateau()
    rows = [[s, 0.0, {"loss": 3.0 * 0.999 ** s * (1 + 0.2 * rng.uniform(-1, 1))}] for s in range(1, 3001)]
    assert falling.add(rows) is None
    flat = Plateau()
    rows = [[s, 0.0, {"loss": 2.3 * (1 + 0.2 * rng.uniform(-1, 1))}] for s in range(1, 3001)]
    found = flat.add(rows)
    assert found and found["stale_steps"] >= 500 and found["step"] < 1000


def test_lr_zero_forgives_a_warmup_that_starts_at_zero():
    from ptdash.doctor_rules import LrZero

    warmup = [[s, 0.0, {"opt/lr/group0": (s - 1) * 1e-4}] for s in range(1, 50)]
    assert LrZero().add(warmup) is None
    zero = [[s, 0.0, {"opt/lr/group0": 1e-3, "opt/lr/group1": 0.0}] for s in range(1, 20)]
    assert LrZero().add(zero) == {"1": (1, 19)}  # the run so far


def test_sync_sampler_counts_lines_that_sync_every_sampled_step():
    import warnings

    from ptdash.doctor_rules import SyncSampler

    modes = []
    sampler = SyncSampler(first=3, set_mode=modes.append, get_mode=lambda: 0)
    filters = list(warnings.filters)

    def sync(text="called a synchronizing CUDA operation"):
        import sys

        return sampler.on_warning(text, sys._getframe(1))

    results = []
    for step in range(1, 6):
        if sampler.active:
            assert sync()  # a line that syncs every step
            if step == 3:
                assert sync()  # a line that syncs once (a logging step)
            assert not sync("an unrelated warning")
        results.append(sampler.on_post_step(step))
    assert modes == ["warn", 0] and warnings.filters == filters
    found = [r for r in results if r]
    assert len(found) == 1 and found[0]["steps"] == [3, 4] and found[0]["per_step"] == 1
    (line,) = found[0]["lines"]
    assert line["text"] == "assert sync()  # a line that syncs every step" and line["kind"] == "read-back"
    assert sampler.next_start == 30


def test_inplace_crash_under_detect_anomaly_names_the_forward_op():
    import torch
    from ptdash.doctor import Doctor

    engine = _Engine({"detect_anomaly": True})
    doctor = Doctor(engine)
    doctor.attach()
    try:
        h = torch.randn(4, requires_grad=True)
        y = h.sigmoid()  # the forward op whose output autograd saved
        y.mul_(2)
        with pytest.raises(RuntimeError) as caught:
            y.sum().backward()
        doctor.on_crash(caught.value)
    finally:
        doctor.detach()
    (finding,) = [e["data"] for e in engine.events if e["kind"] == "finding"]
    assert finding["id"] == "inplace-autograd" and "y = h.sigmoid()" in finding["what"]
    assert "test_doctor.py:" in finding["forward_source"]
    assert "--detect-anomaly" not in finding["fix"]


def test_ddp_unused_parameter_error_names_the_parameters():
    import torch
    from ptdash.doctor import Doctor

    model = torch.nn.ModuleDict({"used": torch.nn.Linear(4, 1), "spare": torch.nn.Linear(4, 1)})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    engine = _Engine()
    engine.hooks.models = [model]
    doctor = Doctor(engine)
    doctor.attach()
    try:
        model["used"](torch.randn(2, 4)).sum().backward()
        doctor.on_pre_step(opt, 1, [p for p in model.parameters() if p.grad is not None])
        doctor.on_crash(RuntimeError("Expected to have finished reduction in the prior iteration before "
                                     "starting a new one. This error indicates that your module has parameters "
                                     "that were not used in producing loss."))
    finally:
        doctor.detach()
    (finding,) = [e["data"] for e in engine.events if e["kind"] == "finding"]
    assert finding["id"] == "never-learns" and finding["params"] == ["spare.weight", "spare.bias"]


def test_input_bound_blames_only_loader_settings_that_explain_it():
    from ptdash.doctor_rules import DataWatch

    found = []
    watch = DataWatch(lambda rule, what, **data: found.append((rule, data)), lambda: 0)
    watch.loader = (4, True, "train.py:9")
    watch.input_bound(0.8, 30, cuda=True)
    assert found == []  # parallel and pinned: the generic monitor hint is all there is to say
    watch.loader = (4, False, "train.py:9")
    watch.input_bound(0.8, 30, cuda=True)
    (rule, data), = found
    assert rule == "input-bound" and "pin_memory=True" in data["fix"] and "num_workers=" not in data["fix"]


def test_host_sync_sampling_end_to_end_in_process(monkeypatch):
    """The doctor's CUDA path with the CUDA calls faked: warnings from the script's line are
    counted on the two sampled steps, kept from the output, and raise host-syncs once."""
    import warnings

    import torch
    from ptdash import doctor_rules
    from ptdash.doctor import Doctor

    modes = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    engine = _Engine()
    doctor = Doctor(engine)
    doctor.syncs = doctor_rules.SyncSampler(first=3, set_mode=modes.append, get_mode=lambda: 0)
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    shown = []
    monkeypatch.setattr(warnings, "showwarning", lambda *a, **k: shown.append(a))
    doctor.attach()
    doctor._cuda = True
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # as under PYTHONWARNINGS=ignore: sampling must still count
            for step in range(1, 7):
                model(torch.randn(3, 2)).sum().backward()
                doctor.on_pre_step(opt, step, list(model.parameters()))
                opt.step()
                warnings.warn("called a synchronizing CUDA operation")  # loss.item()
                doctor.on_post_step(opt, step)
    finally:
        doctor.detach()
    (finding,) = [e["data"] for e in engine.events if e["kind"] == "finding"]
    assert finding["id"] == "host-syncs" and finding["step"] == 4 and "test_doctor.py:" in finding["source"]
    assert finding["lines"][0]["per_step"] == 1 and modes == ["warn", 0] and shown == []


def test_doctor_command_imports_neither_torch_nor_textual():
    import subprocess
    import sys

    code = "import sys, ptdash.tui.doctor_cli; print('torch' in sys.modules, 'textual' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
