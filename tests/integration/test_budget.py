"""The cost budget through the real CLI: the sampling period follows the step time, and
the NaN guard's behaviour on steps it does not sample.

Nothing here depends on timing: the scripts end each phase on the period the engine
chose (read from the engine in the script's own process), and the margins are wide
(a slow step is 30 ms against a sampled step's cost of well under a millisecond; a fast
step costs a fraction of its norm pass over 300 tensors). What is checked is what the
store kept: which steps have a total gradient norm (only sampled ones do, the scripts do
not clip), the 'sampling' events and the budget's samples.
"""

from __future__ import annotations

import json
import re

from support.runner import SCRIPTS, ptdash


def _store(run_dir):
    from ptdash.shared.reader import StoreReader
    return StoreReader(run_dir / "metrics.db")


def _sampled_steps(run_dir) -> tuple[list[int], set[int]]:
    with _store(run_dir) as s:
        steps, _ = s.series("loss")
        normed, _ = s.series("grad/norm_total")
    return steps, set(normed)


def test_sampling_thins_when_steps_become_fast_and_recovers_when_they_slow(tmp_path):
    result = ptdash("--headless", "--run-dir", "run", "--overhead-budget", "10", str(SCRIPTS / "speeds_up.py"),
                    cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    slow_end = int(re.search(r"slow until (\d+) every 1\b", out).group(1))
    m = re.search(r"fast thinned at (\d+) until (\d+) every (\d+)", out)
    thinned, fast_end, every = (int(g) for g in m.groups())
    m = re.search(r"slow again dense at (\d+) until (\d+) every 1\b", out)
    dense, end = (int(g) for g in m.groups())
    assert every > 1
    steps, normed = _sampled_steps(tmp_path / "run")
    assert steps == list(range(1, end + 1))
    # Slow steps: every one sampled, past the 64 steps the budget always samples too.
    assert all(s in normed for s in range(1, slow_end + 1))
    # Fast steps once thinned: only some, each on a multiple of a period of at least 2.
    fast = [s for s in range(thinned + 1, fast_end + 1)]
    kept = [s for s in fast if s in normed]
    assert 0 < len(kept) <= len(fast) // 2, kept
    assert all(s % 2 == 0 for s in kept), kept
    # Slow again: every step sampled once the period is back to 1.
    assert all(s in normed for s in range(dense + 1, end + 1))
    with _store(tmp_path / "run") as s:
        events = [e for e in s.events() if e.kind == "sampling"]
        periods = s.sampled("ptdash/layers_every")[1]
        shares = [v for v in s.sampled("ptdash/step_pct")[1] if v is not None]
    assert events[0].data["every"] > 1 and "per-layer gradient norms one step in" in events[0].message
    assert events[-1].data["every"] == 1 and "every step" in events[-1].message
    assert max(periods) > 1 and shares and all(v >= 0 for v in shares)
    # show --once says it too: the median share over the run, the budget, the periods at the end.
    text = ptdash("show", "run", "--once", cwd=tmp_path).stdout
    assert re.search(r"cost        ptdash: (<0\.1|\d+\.\d)% of step time \(budget 10%\), its threads "
                     r"(<0\.1|\d+\.\d)% of a core \(median over the run\); not thinned: every step sampled "
                     r"\(total and per-layer norms; update ratios every --update-ratio-every\); doctor checks", text), text
    summary = json.loads(ptdash("show", "run", "--once", "--json", cwd=tmp_path).stdout)
    cost = summary["cost"]
    assert cost["budget_pct"] == 10.0 and cost["layers_every"] == 1 and cost["doctor_every"] == 16
    assert cost["readings"] == len(shares) and cost["step_pct"] >= 0 and cost["threads_pct"] >= 0


def test_a_nan_loss_on_an_unsampled_step_is_caught_before_its_update(tmp_path):
    result = ptdash("--headless", "--run-dir", "run", "--on-anomaly", "skip", "--overhead-budget", "1",
                    str(SCRIPTS / "nan_thinned.py"), "loss", cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    planted = int(re.search(r"planted at (\d+) every (\d+)", result.stdout).group(1))
    # The loss is checked on every step: the bad update was skipped, the parameters stayed finite.
    assert f"step {planted} finite True" in result.stdout and "finite False" not in result.stdout
    steps, normed = _sampled_steps(tmp_path / "run")
    assert planted not in normed  # the step really was not sampled
    with _store(tmp_path / "run") as s:
        anomalies = [e for e in s.events() if e.kind == "anomaly"]
    assert anomalies[0].data["step"] == planted and "update skipped" in anomalies[0].message
    assert anomalies[0].data["layer"] == "the loss"


def test_a_nan_gradient_on_an_unsampled_step_is_caught_through_the_next_loss(tmp_path):
    result = ptdash("--headless", "--run-dir", "run", "--on-anomaly", "skip", "--overhead-budget", "1",
                    str(SCRIPTS / "nan_thinned.py"), "grad", cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    planted = int(re.search(r"planted at (\d+) every (\d+)", result.stdout).group(1))
    # Its update went through (the documented cost of thinning): the parameters are non-finite
    # after it, and the next step's loss, non-finite, is caught before that step's update.
    assert f"step {planted} finite False" in result.stdout
    steps, normed = _sampled_steps(tmp_path / "run")
    assert planted not in normed
    with _store(tmp_path / "run") as s:
        anomalies = [e for e in s.events() if e.kind == "anomaly"]
    assert anomalies[0].data["step"] == planted + 1 and "update skipped" in anomalies[0].message
