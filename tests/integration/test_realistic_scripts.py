"""The realistic script corpus (tests/scripts/realistic): each script run under plain
`python` and under `ptdash --headless`, side by side, must exit the same way and print the
same thing byte for byte (ptdash changes neither the script's output nor its numbers when
no command is given), finish as it should, and write files only under its --out-dir.
Each case uses flags that keep it to a couple of seconds.
"""

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

CORPUS = Path(__file__).resolve().parents[1] / "scripts" / "realistic"
RANK_PIECE = re.compile(r"\n|(?=\[rank \d+\] )")


def run(script, args, cwd, under_ptdash=False):
    # Two runs go side by side; one thread each keeps them from fighting over the cores.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "default"}
    front = [sys.executable, "-m", "ptdash.tui.cli", "--headless", "--run-dir", str(cwd.parent / f"{cwd.name}-run")]
    result = subprocess.run([*(front if under_ptdash else [sys.executable]), str(CORPUS / script), *args],
                            capture_output=True, text=True, timeout=180, env=env, cwd=cwd)
    if under_ptdash:
        # What the script printed, both streams, as ptdash kept it.
        result.stdout = (cwd.parent / f"{cwd.name}-run" / "output.log").read_text()
    return result


def run_plain_and_ptdash(tmp_path, script, args, out_dir=False):
    def one(name):
        cwd = tmp_path / name
        cwd.mkdir()
        extra = ["--out-dir", str(tmp_path / f"{name}-out")] if out_dir else []
        return run(script, [*args, *extra], cwd, under_ptdash=name == "ptdash"), cwd

    with ThreadPoolExecutor(2) as pool:
        (a, cwd_a), (b, cwd_b) = pool.map(one, ("plain", "ptdash"))
    assert not any(cwd_a.iterdir()) and not any(cwd_b.iterdir()), "wrote files outside --out-dir"
    return a, b


def per_rank(stdout):
    """Each rank's own lines in order; ranks print concurrently, so their lines (and, when
    stdout is unbuffered, pieces of lines) interleave differently from run to run."""
    ranks = {}
    for piece in filter(None, (p.strip() for p in RANK_PIECE.split(stdout))):
        match = re.match(r"\[rank (\d+)\] ", piece)
        ranks.setdefault(match.group(1) if match else None, []).append(piece)
    return ranks


def check_mnist(stdout, out_dir):
    snapshots = re.findall(r"^Snapshot after step (\d+): deepcopy (\S+) \| pickled model (\S+) \|", stdout, re.M)
    assert [s[0] for s in snapshots] == ["1", "3", "12"]
    assert all(copied == pickled for _, copied, pickled in snapshots), "a copy differs from the model"
    assert re.search(r"^Test set: Average loss: [0-9.]+, Accuracy: \d+/1000 \(\d+%\)$", stdout, re.M)
    assert (out_dir / "best_model.pt").is_file()


def check_clipped_to_5(stdout, out_dir):
    norms = [float(n) for n in re.findall(r"^step \d+ post-clip norm (\S+)$", stdout, re.M)]
    assert len(norms) == 40 and all(abs(n - 5) < 1e-4 for n in norms), norms


def check_loss_rises_with_return(stdout, out_dir):
    rows = re.findall(r"^update \d+ return (\S+) loss (\S+)$", stdout, re.M)
    (first_return, first_loss), (last_return, last_loss) = [tuple(map(float, r)) for r in (rows[0], rows[-1])]
    assert last_return > 2 * first_return and last_loss > first_loss, rows


CASES = [
    ("mnist_like/train.py", ["--epochs", "2", "--train-size", "640", "--log-interval", "4",
                             "--eval-every", "7", "--snapshot-steps", "1,3,12"], check_mnist),
    ("manual_sgd.py", ["--steps", "150", "--clip", "0.5"], None),
    ("manual_sgd.py", ["--backward-only", "3000"], None),
    ("gan.py", ["--steps", "200"], None),
    ("clip_self.py", ["--steps", "40", "--print-norms", "--max-norm", "5"], check_clipped_to_5),
    ("eval_every.py", ["--steps", "60", "--eval-every", "20", "--eval-batches", "5", "--sleep-eval", "0.01"], None),
    ("rl_ppo_like.py", ["--updates", "8", "--epochs-per-update", "2"], check_loss_rises_with_return),
    ("onecycle.py", ["--epochs", "2"], None),
    ("cosine.py", ["--steps", "100"], None),
    ("seq_first.py", ["--epochs", "1"], None),
    ("print_metrics.py", ["--epochs", "2", "--bar-stream", "stdout"], None),
]
OUT_DIR = {"mnist_like/train.py"}


@pytest.mark.parametrize("script, args, check", CASES, ids=[f"{s}:{' '.join(a)}" for s, a, _ in CASES])
def test_the_same_output_plain_and_under_ptdash(tmp_path, script, args, check):
    a, b = run_plain_and_ptdash(tmp_path, script, args, out_dir=script in OUT_DIR)
    assert a.returncode == 0, f"{script} exited {a.returncode}:\n{a.stderr[-3000:]}"
    assert b.returncode == 0, f"under ptdash, {script} exited {b.returncode}:\n{b.stderr[-3000:]}"
    assert a.stderr == "", a.stderr  # so that output.log (both streams) compares with stdout alone
    assert b.stdout == a.stdout
    assert a.stdout.splitlines()[-1] == "done"
    if check:
        check(a.stdout, tmp_path / "plain-out")
        check(b.stdout, tmp_path / "ptdash-out")


@pytest.mark.slow
@pytest.mark.parametrize("script", ["mp_spawn_ddp.py", "lightning_like_reexec.py"])
def test_ddp_ranks_agree_and_ptdash_changes_no_number(tmp_path, script):
    a, b = run_plain_and_ptdash(tmp_path, script, ["--epochs", "1", "--steps", "3"])
    assert a.returncode == b.returncode == 0, (a.stderr[-3000:], b.stderr[-3000:])
    ranks = per_rank(a.stdout)
    assert ranks == per_rank(b.stdout)  # every rank's losses and final parameters, exactly
    assert ranks[None] == ["done"]
    finals = {r: lines[-1].split(" final parameter ", 1)[1] for r, lines in ranks.items() if r is not None}
    assert sorted(finals) == ["0", "1"] and finals["0"] == finals["1"], finals
    assert all(len(lines) == 2 + 3 for r, lines in ranks.items() if r is not None)
