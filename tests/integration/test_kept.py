"""What a run kept, said as counts and true, through the real CLI: the total gradient norm's
floor under the cost budget (a short run of fast steps keeps it to its end), every step's
update ratios stored, and ``show --once`` counting what the store holds."""

from __future__ import annotations

import json
import re

from support.runner import SCRIPTS, ptdash

REALISTIC = SCRIPTS / "realistic"


def _store(run_dir):
    from ptdash.shared.rows import RowReader
    return RowReader(run_dir / "metrics.db")


def _kept_row(text: str) -> dict[str, int]:
    found = re.search(r"^  kept        total grad norm at ([\d,]+) of ([\d,]+) steps, per-layer norms at ([\d,]+), "
                      r"update ratios at ([\d,]+)$", text, re.M)
    assert found, text
    norm, steps, layers, ratios = (int(g.replace(",", "")) for g in found.groups())
    return {"steps": steps, "norm": norm, "layers": layers, "ratios": ratios}


def test_a_short_sac_run_thinned_hard_keeps_its_total_norm_to_the_end(tmp_path):
    # --overhead-budget 0.1: the budget alone thins to one step in 256 after the first 64
    # (a SAC update is short against its norm pass, as in the run at the default budget).
    result = ptdash("--headless", "--run-dir", "run", "--overhead-budget", "0.1", str(REALISTIC / "sac_short.py"),
                    cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    with _store(tmp_path / "run") as store:
        steps, _ = store.series("loss")
        normed, _ = store.series("grad/norm_total")
        sampling = [e for e in store.events() if e.kind == "sampling"]
        kept = store.kept()
    end = steps[-1]
    assert end == 150, steps[-5:]
    assert any(s > end * 4 // 5 for s in normed), normed  # the total norm in the last fifth of the run
    # The floor: never a gap of more than a quarter of the steps so far between two norms.
    for before, after in zip(normed, normed[1:] + [end]):
        assert after - before <= max(1, after // 4), (before, after, normed)
    assert sampling and sampling[0].data["every"] > 1, sampling  # it did thin
    assert any("the floor keeps a sampled step" in e.message for e in sampling), [e.message for e in sampling]
    said = _kept_row(ptdash("show", "run", "--once", cwd=tmp_path).stdout)
    assert said == kept and said["steps"] == 150 and said["norm"] == len(normed), (said, kept)
    assert json.loads(ptdash("show", "run", "--once", "--json", cwd=tmp_path).stdout)["kept"] == kept


def test_a_script_that_clips_every_step_says_how_often_its_layers_were_kept(tmp_path):
    result = ptdash("--headless", "--run-dir", "run", "--update-ratio-every", "50", str(REALISTIC / "clip_self.py"),
                    "--steps", "200", cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    with _store(tmp_path / "run") as store:
        normed, _ = store.series("grad/norm_total")
        layers = store.layers()
        samples = store.latest_samples()
    assert normed == list(range(1, 201))  # the script's clip computes the total on every step: kept on each
    # Every --update-ratio-every step's ratios are stored, at its own step.
    assert [r.step for r in layers if r.update_ratios is not None] == [50, 100, 150, 200], \
        [(r.step, r.update_ratios is not None) for r in layers]
    said = _kept_row(ptdash("show", "run", "--once", cwd=tmp_path).stdout)
    assert said == {"steps": 200, "norm": 200, "layers": len(layers), "ratios": 4}, said
    # The engine's own count, which the System and Layers tabs show, says the same.
    assert {k: int(samples[f"ptdash/kept_{n}"]) for k, n in (("steps", "steps"), ("norm", "norm_steps"),
                                                               ("layers", "layer_steps"), ("ratios", "ratio_steps"))} \
        == said, samples
