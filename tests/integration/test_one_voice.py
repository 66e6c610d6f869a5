"""What ptdash says of a run, through the real CLI: the headless line's ``last:`` names only
what asks for attention, the final line says how the run ended once, and ``show --once`` and
``ptdash doctor`` list every rollback with its step and what was done."""

from __future__ import annotations

import json
import re

from support.runner import SCRIPTS, ptdash

WILD = SCRIPTS / "wild_batch.py"

PRINTING = '''\
"""A small regression whose loop prints its metrics every step, as scripts in the wild do."""
import argparse
import time

import torch

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=120)
p.add_argument("--pace", type=float, default=0.06, help="seconds a step (the loop's own data wait)")
args = p.parse_args()
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for step in range(1, args.steps + 1):
    x = torch.randn(16, 4)
    loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
    opt.zero_grad()
    loss.backward()
    opt.step()
    time.sleep(args.pace)
    print(f"step {step} | acc {1 - 1 / step:.3f} | val_mse {loss.item() * 1.1:.4f} | tokens {step * 512}", flush=True)
'''


def _progress_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if re.match(r"\[ptdash\] (running|paused) \| step ", line)]


def test_printed_metrics_never_become_the_last_event_and_the_end_is_said_once(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(PRINTING)
    # 120 steps of at least 60 ms: over 7 s, so at least one progress line (one every 5 s).
    result = ptdash("--headless", "--run-dir", "run", str(script), cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    lines = _progress_lines(out)
    assert lines, out[-3000:]
    assert not any("| last: " in line for line in lines), lines  # nothing in this run asks for attention
    final = [line for line in out.splitlines() if line.startswith("[ptdash] finished")]
    assert len(final) == 1 and final[0].count("finished") == 1, final
    assert final[0].startswith("[ptdash] finished (exit code 0); step 120"), final
    doctor = ptdash("doctor", "run", cwd=tmp_path).stdout
    assert re.search(r"Metrics read from the script's output \(\d found", doctor), doctor  # where they are listed


def test_a_rolled_back_run_lists_its_rollback_in_show_and_the_doctor(tmp_path):
    result = ptdash("--headless", "--run-dir", "run", "--on-anomaly", "rollback", "--rollback-every", "10",
                    str(WILD), "--bad", "inf", cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:]
    (final,) = [line for line in result.stdout.splitlines() if line.startswith("[ptdash] finished")]
    assert re.search(r" \| \d+ anomal(y|ies): ptdash show run --once lists them$", final), final
    text = ptdash("show", "run", "--once", cwd=tmp_path).stdout
    assert re.search(r"^  anomalies   \d+$", text, re.M), text
    rows = [line.strip() for line in text.splitlines() if line.startswith("              step ")]
    assert any(row.startswith("step 81 (rolled back to step 80, 1 batch skipped): non-finite") for row in rows), text
    summary = json.loads(ptdash("show", "run", "--once", "--json", cwd=tmp_path).stdout)
    assert {"step": 81, "kind": "rollback", "action": "rolled back to step 80, 1 batch skipped", "ranks": [0]}.items() \
        <= next(r for r in summary["anomalies"] if r["kind"] == "rollback").items()
    doctor = ptdash("doctor", "run", cwd=tmp_path)
    assert "Anomalies and what was done (" in doctor.stdout, doctor.stdout
    assert "   step 81 (rolled back to step 80, 1 batch skipped): non-finite" in doctor.stdout, doctor.stdout
    found = json.loads(ptdash("doctor", "run", "--json", cwd=tmp_path).stdout)
    assert any(r["action"] == "rolled back to step 80, 1 batch skipped" for r in found["anomalies"]), found


def test_a_healthy_run_says_it_had_no_anomalies(tmp_path):
    result = ptdash("--headless", "--run-dir", "run", str(WILD), "--bad", "none", "--steps", "60", cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "anomal" not in result.stdout
    text = ptdash("show", "run", "--once", cwd=tmp_path).stdout
    assert re.search(r"^  anomalies   none$", text, re.M), text
    assert json.loads(ptdash("show", "run", "--once", "--json", cwd=tmp_path).stdout)["anomalies"] == []
    assert "Anomalies" not in ptdash("doctor", "run", cwd=tmp_path).stdout
