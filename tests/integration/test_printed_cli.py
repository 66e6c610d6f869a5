"""Metrics the script only prints, through the real CLI: every form, each value at its step."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys

import pytest

from ptdash.shared import names
from ptdash.shared.reader import StoreReader
from ptdash.tui.app import make_app
from ptdash.tui.fmt import fmt_num
from ptdash.tui.source.replay import ReplaySource
from support.pilot import screen_text, until
from support.printed import each_ranks_printed
from support.runner import ENV, SCRIPTS, ptdash


def test_every_printed_value_is_in_the_store_at_its_step_and_nothing_else_is(tmp_path):
    printed = tmp_path / "printed.json"
    result = ptdash("--headless", "--run-dir", "run", str(SCRIPTS / "printed_forms.py"), str(printed), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    expected = {int(step): values for step, values in json.loads(printed.read_text()).items()}
    wanted = {name for values in expected.values() for name in values}
    # k=v, k: v, a metric word's value, a dict, a JSON line, a tqdm bar, a Keras line, a table row
    assert len(wanted) == 12 and len(expected) == 20
    with StoreReader(tmp_path / "run" / "metrics.db") as store:
        found = {names.parse_printed(n) for n in store.names()} - {None}
        # No counter (epoch, step), rate (ms/step, it/s, samples/s), runtime, learning rate,
        # version, date, path or percentage became a series.
        assert found == wanted
        series = {name: dict(zip(*store.series(names.printed(name)))) for name in wanted}
        events = [e for e in store.events() if e.kind == "printed"]
    for step, values in expected.items():
        for name, value in values.items():
            assert series[name].get(step) == value, (name, step, series[name])
    assert sum(len(s) for s in series.values()) == sum(len(v) for v in expected.values())
    # The first value of each name is an event that says where it came from.
    assert sorted(e.data["name"] for e in events) == sorted(wanted)
    first = next(e for e in events if e.data["name"] == "val_loss")
    assert first.step == 1 and first.message.startswith("found printed metric val_loss = 2 at step 1: epoch 0 |")
    # show --once and export see them as they see any series.
    shown = ptdash("show", "run", "--once", "--json", cwd=tmp_path)
    summary = {p["name"]: p for p in json.loads(shown.stdout)["printed"]}
    assert set(summary) == wanted and summary["val_loss"]["last"] == {"step": 16, "value": expected[16]["val_loss"]}
    text = ptdash("show", "run", "--once", cwd=tmp_path).stdout
    assert "  printed     eval_accuracy  last 0.5 (step 17)" in text
    doctor = ptdash("doctor", "run", cwd=tmp_path)  # each guess, with its line, where the doctor reports
    assert doctor.returncode == 0 and "Metrics read from the script's output (12 found;" in doctor.stdout
    assert "   val_mse = 4.3333 at step 3: 100%|####| 4/4 [00:04<00:00" in doctor.stdout
    exported = ptdash("export", "run", "--format", "csv", "-o", "run.csv", cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    header, *lines = (tmp_path / "run.csv").read_text().splitlines()
    column = header.split(",").index(names.printed("valid_acc"))
    assert [float(line.split(",")[column]) for line in lines if line.split(",")[column]] == \
        [expected[s]["valid_acc"] for s in (5, 10, 15, 20)]


def test_a_name_the_script_also_gives_ptdash_log_is_left_out_and_said_once(tmp_path):
    (tmp_path / "logs.py").write_text(
        "import ptdash, torch\n"
        "model = torch.nn.Linear(2, 1)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for step in range(1, 7):\n"
        "    ptdash.log(val_loss=float(step))  # taken by this step's record\n"
        "    opt.zero_grad(); model(torch.ones(4, 2)).sum().backward(); opt.step()\n"
        "    print(f'val_loss={step * 10} val_acc={step}', flush=True)\n")
    result = ptdash("--headless", "--run-dir", "run", "logs.py", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    with StoreReader(tmp_path / "run" / "metrics.db") as store:
        assert names.printed("val_loss") not in store.names()
        assert store.series(names.user("val_loss"))[1] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]  # the explicit value wins
        assert store.series(names.printed("val_acc"))[1]  # the other printed name is kept
        messages = [e.message for e in store.events(kind="printed")]
    assert messages.count("printed metric val_loss is left out: ptdash.log gives user/val_loss") == 1


def test_no_parse_output_reads_nothing_the_script_prints(tmp_path):
    result = ptdash("--headless", "--run-dir", "run", "--no-parse-output", str(SCRIPTS / "printed_forms.py"),
                    str(tmp_path / "printed.json"), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "val_loss=2.0 acc: 0.5 |" in (tmp_path / "run" / "output.log").read_text()  # printed as ever
    with StoreReader(tmp_path / "run" / "metrics.db") as store:
        assert [n for n in store.names() if names.parse_printed(n)] == []
        assert store.events(kind="printed") == []
        assert store.series(names.LOSS)[0] == list(range(1, 21))


def test_the_demos_val_loss_is_charted(tmp_path):
    result = ptdash("--headless", "--run-dir", "run", "demo", "--steps", "30", "--n-layer", "1", "--n-embd", "32",
                    "--block-size", "16", "--batch-size", "8", "--log-every", "10", "--eval-every", "15",
                    "--device", "cpu", cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    printed = re.findall(r"^eval step (\d+) \| val loss ([0-9.]+)$", (tmp_path / "run" / "output.log").read_text(),
                         re.MULTILINE)
    assert [int(step) for step, _ in printed] == [15, 30]
    with StoreReader(tmp_path / "run" / "metrics.db") as store:
        steps, values = store.series(names.printed("val_loss"))
        kept = sorted(n for n in store.names() if names.parse_printed(n))
        said = [e.message for e in store.events(kind="printed")]
    # At the step it was printed at (the relay may read it later: marks say when it was written).
    assert values == [float(v) for _, v in printed] and steps == [15, 30], steps
    # Its "step 10 | loss 2.93" lines and "done | final train loss" are the loss ptdash
    # records itself, to the digits printed: not a second series (or a one-point one), and said.
    assert kept == [names.printed("val_loss")], kept
    assert sum("printed metric loss is the loss ptdash records" in m for m in said) == 1, said
    assert sum("printed metric final_train_loss is the loss ptdash records" in m for m in said) == 1, said
    doctor = ptdash("doctor", "run", cwd=tmp_path).stdout
    assert "Metrics read from the script's output (3 found, 2 of them left out;" in doctor, doctor
    assert f"| val_loss {float(printed[-1][1]):.5g} @{steps[1]} |" in result.stdout  # the headless progress line
    # On screen: the printed panel draws it over the training loss ptdash records.
    app = make_app(ReplaySource(tmp_path / "run"))

    async def scenario():
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: app.drawn and "─ printed " in screen_text(app), what="the printed panel")
            legend = next(line for line in screen_text(app).splitlines() if "─ printed " in line)
            assert f"val_loss {fmt_num(float(printed[-1][1]), 4)}" in legend and "train loss " in legend, legend

    asyncio.run(asyncio.wait_for(scenario(), 120))


@pytest.mark.slow
@pytest.mark.parametrize("how", ["nproc-per-node", "mp.spawn"])
def test_under_ddp_each_ranks_printed_metrics_are_its_own_at_its_steps(tmp_path, how):
    launch = ["--nproc-per-node", "2", str(SCRIPTS / "ddp_printed.py")] if how == "nproc-per-node" else \
        [str(SCRIPTS / "ddp_printed.py"), "--spawn"]
    result = ptdash("--headless", "--run-dir", "run", *launch, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    each_ranks_printed(tmp_path / "run")


@pytest.mark.slow
@pytest.mark.parametrize("parse", ["read", "PTDASH_PARSE_OUTPUT=0"])
def test_under_your_own_torchrun_each_ranks_prints_are_read_and_its_fds_left_as_they_are(tmp_path, parse):
    """``torchrun --nproc-per-node 2 -m ptdash.bootstrap``: the ranks' fds stay torchrun's
    (stdout and stderr apart, here two files), their prints are read at their own steps;
    ``PTDASH_PARSE_OUTPUT=0`` reads none."""
    env = {**ENV, "PTDASH_PARSE_OUTPUT": "0"} if parse != "read" else ENV
    with open(tmp_path / "out", "w") as out, open(tmp_path / "err", "w") as err:
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                               "-m", "ptdash.bootstrap", str(SCRIPTS / "ddp_printed.py")],
                              cwd=tmp_path, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL, timeout=300)
    said = (tmp_path / "out").read_text()
    assert proc.returncode == 0, said + (tmp_path / "err").read_text()
    (run_dir,) = [p.parent for p in (tmp_path / "ptdash-runs").glob("*/run.json")]
    assert "ptdash: run dir" in (tmp_path / "err").read_text() and "ptdash: run dir" not in said
    if parse == "read":
        # The lines went where torchrun put them, as without ptdash: every value line on
        # stdout; rank 0 said where the run dir is on stderr.
        each_ranks_printed(run_dir, output=said)
        return
    assert sum(line.startswith("rank ") for line in said.splitlines()) == 8
    with StoreReader(run_dir / "metrics.db") as store:
        assert [n for n in store.names() if names.parse_printed(n)] == [] and store.events(kind="printed") == []
        assert store.last_step(0) == 20 and store.last_step(1) == 20


@pytest.mark.parametrize("how", ["sys.stdout", "own-stdout"])
def test_under_a_flood_of_output_every_printed_value_is_at_the_step_it_was_written_at(tmp_path, how):
    # 6 KB a step at 1-2k steps a second: the relay reads what was written several steps
    # before (values landed up to 8 steps late when kept at the step they were read at).
    # The script's own streams on fds 1 and 2 (own-stdout) are marked from the step after
    # it first printed through them; its os.write to fd 1 is kept by the marks around it.
    options = ["--own-stdout"] if how == "own-stdout" else []
    result = ptdash("--headless", "--run-dir", "run", str(SCRIPTS / "printed_flood.py"), "1500", "expected.log",
                    *options, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    with StoreReader(tmp_path / "run" / "metrics.db") as store:
        val = dict(zip(*store.series(names.printed("val_loss"))))
        raw = dict(zip(*store.series(names.printed("raw_mse"))))
    every = list(range(25, 1501, 25))
    assert val == {step: step + 0.5 for step in every}, {s: v for s, v in val.items() if v != s + 0.5}
    assert raw == {step: step + 0.25 for step in every}, {s: v for s, v in raw.items() if v != s + 0.25}
    # output.log holds exactly the bytes the script wrote, in its order: no mark reached it.
    assert (tmp_path / "run" / "output.log").read_bytes() == (tmp_path / "expected.log").read_bytes()
