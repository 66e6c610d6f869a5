"""Scripts shaped like the ones people publish (tests/scripts/realistic), through the real
CLI: ptdash must be invisible to them and see every way they train.

Each test runs a script under plain python and/or under ``ptdash --headless`` and reads
the run's store, events and output as a user's tools would.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ptdash.shared import rundir
from ptdash.shared.events import Optimizer, read
from ptdash.shared.reader import StoreReader
from support.runner import ENV, REPO, SCRIPTS, Run, ptdash

REAL = SCRIPTS / "realistic"
TINY_DEMO = ("--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--batch-size", "8", "--block-size", "32",
             "--log-every", "5", "--eval-every", "0")


def _clean(text: str) -> list[str]:
    """Output lines without torch's warning about a missing numpy (printed at its import)."""
    lines = text.splitlines()
    return [line for i, line in enumerate(lines) if "Failed to initialize NumPy" not in line
            and not (i and "Failed to initialize NumPy" in lines[i - 1])]


def plain(script: Path, *args: str, cwd: Path, env: dict | None = None) -> str:
    result = subprocess.run([sys.executable, str(script), *args], cwd=cwd, capture_output=True, text=True,
                            env=env or ENV, timeout=300, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return result.stdout + result.stderr


def under_ptdash(script: Path | str, *args: str, cwd: Path, options: tuple = (), env: dict | None = None,
                 run: str = "run", code: int = 0) -> Path:
    result = ptdash("--headless", "--run-dir", run, *options, str(script), *args, cwd=cwd, env=env, timeout=600)
    assert result.returncode == code, result.stdout[-3000:] + result.stderr[-2000:]
    return cwd / run


def events(run_dir: Path, kind: str | None = None) -> list:
    with StoreReader(run_dir / "metrics.db") as store:
        return store.events(kind=kind)


def series(run_dir: Path, name: str) -> tuple[list[int], list]:
    with StoreReader(run_dir / "metrics.db") as store:
        return store.series(name)


def sampled(run_dir: Path, name: str) -> tuple[list[float], list]:
    """``(walls, values)`` of a reading the engine takes by time (host, GPU)."""
    with StoreReader(run_dir / "metrics.db") as store:
        return store.sampled(name)


def rows(run_dir: Path, *names: str) -> dict[int, dict[str, float | None]]:
    """Step -> {name: value} of the given series."""
    out: dict[int, dict] = {}
    with StoreReader(run_dir / "metrics.db") as store:
        for name in names:
            for step, value in zip(*store.series(name)):
                out.setdefault(step, {})[name] = value
    return out


# --------------------------------------------------------------------- invisible


def test_a_model_pickled_and_deep_copied_at_any_step_runs_as_under_python(tmp_path):
    # mnist_like deep-copies the model and pickles model, optimizer and scheduler after
    # steps 1, 3, 64 and 100, and saves its best model with torch.save(model) each epoch.
    args = ("--save-model", "--out-dir", "out")
    (tmp_path / "plain").mkdir()
    expected = plain(REAL / "mnist_like" / "train.py", *args, cwd=tmp_path / "plain")
    run_dir = under_ptdash(REAL / "mnist_like" / "train.py", *args, cwd=tmp_path)
    got = (run_dir / "output.log").read_text()
    assert _clean(got) == _clean(expected)
    assert "Snapshot after step 100" in got and "Saved best model" in got
    # What the script saved holds nothing of ptdash: it loads where ptdash is not installed.
    saved = tmp_path / "out" / "best_model.pt"
    assert b"ptdash" not in saved.read_bytes()
    code = ("import sys, torch; sys.path.insert(0, sys.argv[2]); m = torch.load(sys.argv[1], weights_only=False); "
            "print(type(m).__name__, len(m._forward_pre_hooks))")
    out = subprocess.run([sys.executable, "-S", "-c", code, str(saved), str(REAL / "mnist_like")],
                         capture_output=True, text=True, env={**ENV, "PYTHONPATH": str(Path(torch.__file__).parents[1])})
    assert out.stdout.split() == ["Net", "0"], out.stderr[-2000:]


SELF_AWARE = """\
import os, pickle, sys, warnings
import torch

class Net(torch.nn.Linear):
    pass

def check(model):
    warnings.warn("lr looks high", UserWarning)  # python names this line
    return float(model(torch.ones(1, 2)).sum())

print("file", __file__, os.path.isabs(__file__), os.path.exists(__file__))
print("argv0", sys.argv[0], "path0", sys.path[0] == os.path.dirname(os.path.realpath(__file__)))
print("name", __name__, __spec__ is None, sys.modules["__main__"].__file__ == __file__)
print("pickled", type(pickle.loads(pickle.dumps(Net(2, 1)))).__name__)
model = Net(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    optimizer.zero_grad()
    model(torch.ones(4, 2)).pow(2).mean().backward()
    optimizer.step()
check(model)
def crash(x):
    return x["missing"]
crash({})
"""


def _self_aware(root: Path) -> tuple[Path, dict]:
    (root / "proj" / "pkg").mkdir(parents=True)
    (root / "proj" / "train.py").write_text(SELF_AWARE)
    (root / "proj" / "pkg" / "__init__.py").write_text("")
    (root / "proj" / "pkg" / "train.py").write_text(SELF_AWARE)
    return root / "proj", {**ENV, "PYTHONWARNINGS": "default", "PYTHONUNBUFFERED": "1"}


@pytest.mark.parametrize("target", [("train.py",), ("-m", "pkg.train")], ids=["script", "module"])
def test_a_script_sees_itself_warns_and_crashes_as_under_python(tmp_path, target):
    # __file__, argv[0], sys.path[0], __main__ in sys.modules, a warning's line and the
    # crash's traceback (runpy's frames included for -m, as python shows them).
    proj, env = _self_aware(tmp_path)
    expected = subprocess.run([sys.executable, *target], cwd=proj, capture_output=True, text=True, env=env,
                              timeout=120, stdin=subprocess.DEVNULL)
    assert expected.returncode == 1 and "KeyError: 'missing'" in expected.stderr
    run_dir = under_ptdash(target[0], *target[1:], cwd=proj, env=env, code=1)
    got = _clean((run_dir / "output.log").read_text())
    want = _clean(expected.stdout + expected.stderr)
    assert sorted(got) == sorted(want)  # stdout and stderr interleave as the pipes deliver them
    assert [line for line in got if not line.startswith(("file", "argv0", "name", "pickled", "path0"))] == \
        [line for line in want if not line.startswith(("file", "argv0", "name", "pickled", "path0"))]
    assert any("lr looks high" in line for line in got) and "ptdash" not in "".join(got)
    assert [e.message for e in events(run_dir, "run") if "crashed" in e.message] == \
        ["crashed with exit code 1: KeyError: 'missing'"]
    assert rundir.read_info(run_dir).status == "crashed"


# ------------------------------------------------------------ without an optimizer


def test_training_without_an_optimizer_is_seen_step_by_step(tmp_path):
    run_dir = under_ptdash(REAL / "manual_sgd.py", "--steps", "300", cwd=tmp_path)
    steps, losses = series(run_dir, "loss")
    assert steps == list(range(1, 301)) and all(v is not None for v in losses)
    norm_steps, norms = series(run_dir, "grad/norm_total")
    assert norm_steps == steps and all(n > 0 for n in norms)
    assert set(series(run_dir, "grad/clip_max")[1]) == {1.0}  # the script's own clip_grad_norm_
    assert series(run_dir, "opt/lr/group0") == ([], [])  # no optimizer: the LR is not made up
    with StoreReader(run_dir / "metrics.db") as store:
        assert store.layers() and store.layer_names().names[0] == "0.weight"
    assert not [e for e in events(run_dir, "finding") if e.data["id"] == "no-step"]


def test_training_without_an_optimizer_pauses_resumes_and_stops(tmp_path):
    run = Run(tmp_path, REAL / "manual_sgd.py", "--steps", "100000000", "--log-interval", "100000")
    try:
        run.wait_step(20)
        paused = run.send("pause")
        assert paused.ok and run.info().status == "paused"
        run.resume_after_hold(paused)
        run.wait_step(paused.step + 20)
        stop = run.send("stop")
        assert stop.ok and run.wait() == 0
        assert run.info().status == "stopped" and (run.run_dir / "checkpoints" / f"step-{stop.step}.pt").exists()
    finally:
        run.close()


def test_backward_calls_that_never_make_a_step_keep_memory_flat_and_say_so(tmp_path):
    # Gradients of a fixed model inspected over and over: no optimizer, never cleared.
    script = tmp_path / "inspect_grads.py"
    script.write_text(
        "import torch\n"
        "model = torch.nn.Linear(4, 4)\n"
        "x = torch.randn(8, 4)\n"
        "for i in range(100_000):\n"
        "    model(x).pow(2).mean().backward()\n"
        "print('done', float(model.weight.grad.norm()) > 0)\n")
    run_dir = under_ptdash(script, cwd=tmp_path)
    assert "done True" in (run_dir / "output.log").read_text()
    (finding,) = [e.data for e in events(run_dir, "finding") if e.data["id"] == "no-step"]
    assert "backward() calls and no step" in finding["what"] and finding["severity"] == "warning"
    walls, rss = sampled(run_dir, "host/rss_bytes")
    assert len(rss) >= 3, "the engine sampled its memory too few times"
    assert max(rss[len(rss) // 2:]) - min(rss[len(rss) // 2:]) < 16e6  # flat: no list grows per backward


def test_100000_backward_calls_with_a_clearing_are_100000_steps(tmp_path):
    run_dir = under_ptdash(REAL / "manual_sgd.py", "--backward-only", "100000", cwd=tmp_path)
    with StoreReader(run_dir / "metrics.db") as store:
        assert store.last_step() == 100_000
    rss = sampled(run_dir, "host/rss_bytes")[1]
    assert max(rss[len(rss) // 2:]) - min(rss[len(rss) // 2:]) < 16e6


# ---------------------------------------------------------------- several optimizers


def test_a_gan_records_both_losses_both_lrs_and_both_norms(tmp_path):
    expected = plain(REAL / "gan.py", "--steps", "300", cwd=tmp_path)
    # Every statistic on every step (no cost budget), so both optimizers have all 300 norms.
    run_dir = under_ptdash(REAL / "gan.py", "--steps", "300", cwd=tmp_path, options=("--overhead-budget", "100"))
    assert _clean((run_dir / "output.log").read_text()) == _clean(expected)
    d_steps, d_loss = series(run_dir, "loss")
    g_steps, g_loss = series(run_dir, "opt1/loss")
    assert d_steps == g_steps == list(range(1, 301))  # the generator's step at the iteration it follows
    assert d_loss != g_loss
    assert set(series(run_dir, "opt/lr/group0")[1]) == {4e-4} and set(series(run_dir, "opt1/lr/group0")[1]) == {1e-4}
    assert len(series(run_dir, "grad/norm_total")[1]) == len(series(run_dir, "opt1/grad/norm_total")[1]) == 300
    (named,) = [read(e) for e in events(run_dir, "optimizer")]
    assert named == Optimizer(index=1, cls="Adam", models="Generator")


# ------------------------------------------------------------------ exact commands


def test_a_clip_takes_effect_at_exactly_the_acknowledged_step(tmp_path):
    run = Run(tmp_path, REAL / "clip_self.py", "--steps", "100000", "--print-norms", "--sleep", "0.02")
    try:
        run.wait_step(5)
        ack = run.send("clip", 0.05)
        assert ack.ok and f"from step {ack.step + 1}" in ack.message
        run.wait_step(ack.step + 5)
        assert run.send("stop").ok and run.wait() == 0
        norms = {}
        for line in run.output().splitlines():
            if "post-clip norm" in line:
                step, norm = line.split()[1], line.split()[-1]
                norms[int(step)] = float(norm)
        first = ack.step + 1
        assert norms[first - 1] > 0.05  # the step before still used the script's own max_norm
        assert all(norms[s] <= 0.05 * (1 + 1e-5) for s in norms if s >= first)
        clip = dict(zip(*series(run.run_dir, "grad/clip_max")))
        assert clip[first - 1] == 1000.0 and clip[first] == 0.05
        (journaled,) = [e for e in events(run.run_dir, "command") if e.data.get("name") == "clip"]
        assert journaled.data["applied_step"] == ack.step
    finally:
        run.close()


# ------------------------------------------------------------------ honest figures


def test_the_step_split_adds_up_and_evaluation_is_other_time(tmp_path):
    run_dir = under_ptdash(REAL / "eval_every.py", "--steps", "120", "--eval-every", "20", "--eval-batches", "10",
                           "--sleep-eval", "0.005", cwd=tmp_path)
    parts = ("time/data_s", "time/compute_s", "time/optim_s", "time/other_s")
    split = rows(run_dir, "time/step_s", *parts)
    sampled = {s: v for s, v in split.items() if "time/compute_s" in v}
    assert len(sampled) >= 60
    for step, values in sampled.items():
        assert sum(values[p] for p in parts) == pytest.approx(values["time/step_s"], abs=1e-6), step
    # The evaluation after step 20 runs before step 21's first batch: step 21's "other",
    # never its data wait.
    for step in (21, 41, 61):
        assert sampled[step]["time/other_s"] >= 10 * 0.005, step
        assert sampled[step]["time/data_s"] < sampled[step]["time/other_s"]


def test_step_1_starts_at_the_first_batch_not_at_startup(tmp_path):
    script = tmp_path / "slow_setup.py"
    script.write_text(
        "import time, torch\n"
        "time.sleep(4)  # building a vocabulary, say\n"
        "model = torch.nn.Linear(4, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for x in torch.utils.data.DataLoader(torch.randn(64, 4), batch_size=8):\n"
        "    opt.zero_grad(); model(x).sum().backward(); opt.step()\n")
    run_dir = under_ptdash(script, cwd=tmp_path)
    steps, times = series(run_dir, "time/step_s")
    assert steps[0] == 1 and times[0] < 4.0


def test_samples_per_second_uses_the_loaders_batch_size_for_sequence_first_inputs(tmp_path):
    run_dir = under_ptdash(REAL / "seq_first.py", "--epochs", "1", "--batch-size", "16", "--bptt", "20", cwd=tmp_path)
    values = rows(run_dir, "time/step_s", "throughput/samples_per_s")
    counted = [v for v in values.values() if "throughput/samples_per_s" in v]
    assert counted
    for v in counted:  # B = 16 sequences per batch, not T = 20 time steps
        assert v["throughput/samples_per_s"] * v["time/step_s"] == pytest.approx(16)


def test_closure_training_gets_a_split(tmp_path):
    run_dir = under_ptdash(REPO / "examples" / "lbfgs.py", "--steps", "8", cwd=tmp_path)
    parts = ("time/data_s", "time/compute_s", "time/optim_s", "time/other_s")
    split = [v for v in rows(run_dir, "time/step_s", *parts).values() if "time/compute_s" in v]
    assert split and all(v["time/compute_s"] > 0 for v in split)
    for v in split:
        assert sum(v[p] for p in parts) == pytest.approx(v["time/step_s"], abs=1e-6)


# ------------------------------------------------------------------------ doctor


def test_a_loss_that_rises_while_training_succeeds_raises_no_loss_finding(tmp_path):
    run_dir = under_ptdash(REAL / "rl_ppo_like.py", "--updates", "40", cwd=tmp_path)
    _, losses = series(run_dir, "loss")
    assert statistics.median(losses[-100:]) > statistics.median(losses[:100])  # it does rise
    found = [e.data["id"] for e in events(run_dir, "finding")]
    assert "loss-plateau" not in found, found
    assert not [e.message for e in events(run_dir, "anomaly") if "loss spike" in e.message]


# ------------------------------------------------------------------------ resume


def test_the_demo_resumes_bit_identically(tmp_path):
    whole = under_ptdash("demo", "--steps", "40", *TINY_DEMO, cwd=tmp_path, run="whole")
    first = under_ptdash("demo", "--steps", "40", *TINY_DEMO, cwd=tmp_path, run="first",
                         options=("--checkpoint-every", "20"))
    resumed = under_ptdash("demo", "--steps", "40", *TINY_DEMO, cwd=tmp_path, run="resumed",
                           options=("--resume", str(first / "checkpoints" / "step-20.pt")))
    steps, losses = series(resumed, "loss")
    whole_steps, whole_losses = series(whole, "loss")
    assert steps == list(range(21, 41))
    assert losses == whole_losses[20:]
    assert not [e for e in events(resumed, "warning") if "start_step" in e.message]


def test_a_resumed_onecycle_script_without_start_step_stops_cleanly(tmp_path):
    args = ("--epochs", "2", "--batch-size", "64")
    first = under_ptdash(REAL / "onecycle.py", *args, cwd=tmp_path, run="first", options=("--checkpoint-every", "20"))
    ckpt = sorted((first / "checkpoints").glob("step-*.pt"), key=lambda p: int(p.stem[5:]))[-1]
    resumed = under_ptdash(REAL / "onecycle.py", *args, cwd=tmp_path, run="resumed",
                           options=("--resume", str(ckpt)))
    info = rundir.read_info(resumed)
    assert info.status == "stopped" and info.exit_code == 0
    log = (resumed / "output.log").read_text()
    assert "Tried to step" not in log and "Traceback" not in log
    messages = [e.message for e in events(resumed)]
    assert any("restored model" in m and "not restored: where the script's data loop was" in m for m in messages)
    assert any("does not start its loop at ptdash.start_step()" in m for m in messages)
    assert any("reached its end" in m and "stopping cleanly" in m for m in messages)
