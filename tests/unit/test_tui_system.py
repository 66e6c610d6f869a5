"""The System tab's report: host and GPU readings (any of them N/A), the step-time split, the hint."""

from __future__ import annotations

import pytest

from ptdash.shared.protocol import Metrics, Samples
from ptdash.tui.state import RunState
from ptdash.tui.tabs import system
from support.render import text_of

GIB = 2 ** 30


def state_with(**values) -> RunState:
    """A state that holds one host/GPU reading (they come by time, as Samples)."""
    state = RunState()
    state.add_samples(Samples(rows=[[1.0, values]]))
    return state


def test_system_without_gpu_metrics_says_no_cuda_device():
    state = state_with(**{"host/cpu_pct": 50.0, "host/proc_cpu_pct": 180.0, "host/rss_bytes": 1.5 * GIB,
                          "host/mem_used_bytes": 8 * GIB, "host/mem_total_bytes": 32 * GIB})
    text = text_of(system.report(state, 100))
    assert "no CUDA device" in text and "gpu0" not in text
    assert "50%" in text and "180% (1.8 cores)" in text and "1.5 GiB" in text and "8.0 GiB / 32.0 GiB" in text
    assert "no step timings yet" in text


def test_system_with_partial_gpu_metrics_shows_na():
    state = state_with(**{"gpu0/mem_allocated_bytes": 2 * GIB, "gpu0/mem_reserved_bytes": 3 * GIB,
                          "gpu0/alloc_retries": 2.0, "gpu0/temperature_c": None, "gpu0/ooms": 0.0})
    text = text_of(system.report(state, 120), 120)
    assert "gpu0" in text and "no CUDA device" not in text
    assert "allocated 2.0 GiB" in text and "reserved 3.0 GiB" in text and "peak N/A" in text
    assert "temp N/A" in text and "power N/A / N/A W" in text and "util" in text and "N/A" in text
    assert "retries 2" in text and "fragmentation" in text
    assert "CPU machine" in text and "N/A" in text  # host readings missing too


def test_step_split_adds_up_over_the_same_steps_and_hint():
    state = RunState()
    rows = [[s, 0.0, {"time/data_s": 0.06, "time/compute_s": 0.03, "time/optim_s": 0.01, "time/other_s": 0.0,
                      "time/step_s": 0.1}] for s in range(1, 60)]
    rows[-1][2].update({"time/data_s": 5.0, "time/step_s": 5.04})  # one slow step does not move the picture
    rows[-2][2] = {"time/step_s": 0.1}  # a step that was not sampled
    state.add_metrics(Metrics(rows=rows))
    split = system.step_split(state)
    assert split["time/data_s"] == pytest.approx(0.06) and split["time/step_s"] == pytest.approx(0.1)
    parts = [split[n] for n, _, _ in system.STEP_PARTS]
    assert sum(parts) == pytest.approx(split["time/step_s"])
    state.hint = "input-bound: 60% of each step is spent waiting for data; try more DataLoader workers"
    text = text_of(system.report(state, 100))
    parts = {line.split()[1]: line for line in text.splitlines() if line.strip().startswith("■")}
    assert "60.0 ms" in parts["data"] and "60%" in parts["data"]
    assert "30.0 ms" in parts["forward+backward"] and "10.0 ms" in parts["optimizer"]
    assert "step 100.0 ms" in text
    assert "hint: input-bound" in text
    # Each part from the same steps: an evaluation every few steps shows as "other".
    state = RunState()
    rows = [[s, 0.0, {"time/data_s": 0.01, "time/compute_s": 0.05, "time/optim_s": 0.01,
                      "time/other_s": 0.09 if s % 4 == 0 else 0.0, "time/step_s": 0.16 if s % 4 == 0 else 0.07}]
            for s in range(1, 41)]
    state.add_metrics(Metrics(rows=rows))
    split = system.step_split(state)
    assert sum(split[n] for n, _, _ in system.STEP_PARTS) == pytest.approx(split["time/step_s"])
    assert split["time/other_s"] == pytest.approx(0.09 / 4)


def test_ptdash_own_cost_and_what_it_samples():
    state = state_with(**{"ptdash/step_pct": 0.43, "ptdash/threads_pct": 0.8, "ptdash/budget_pct": 1.0,
                          "ptdash/layers_every": 8.0, "ptdash/doctor_every": 128.0})
    text = text_of(system.report(state, 200), 200)
    assert "ptdash: 0.4% of step time (budget 1%), its threads 0.8% of a core" in text
    assert "per-layer norms (and the total norm, unless the script clips) one step in 8" in text
    assert "doctor checks and the step split one step in 128" in text
    every = state_with(**{"ptdash/step_pct": 0.2, "ptdash/layers_every": 1.0, "ptdash/doctor_every": 16.0})
    assert "not thinned: every step sampled (total and per-layer norms; update ratios every " \
        "--update-ratio-every)" in text_of(system.report(every, 120), 120)
    tiny = state_with(**{"ptdash/step_pct": 0.03, "ptdash/threads_pct": 0.0, "ptdash/budget_pct": 1.0})
    assert "ptdash: <0.1% of step time (budget 1%), its threads 0.0% of a core" in text_of(system.report(tiny, 200), 200)
    # An engine that does not measure itself (an older run): no section at all.
    assert "ptdash:" not in text_of(system.report(state_with(**{"host/cpu_pct": 5.0}), 120), 120)


def test_over_the_budget_at_the_sparsest_sampling_says_why():
    state = state_with(**{"ptdash/step_pct": 2.5, "ptdash/budget_pct": 1.0, "ptdash/layers_every": 256.0})
    text = text_of(system.report(state, 200), 200)
    assert "over the budget at the sparsest sampling" in text
    under = state_with(**{"ptdash/step_pct": 0.5, "ptdash/budget_pct": 1.0, "ptdash/layers_every": 256.0})
    assert "over the budget" not in text_of(system.report(under, 200), 200)
