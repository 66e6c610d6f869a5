"""The ptdash command end to end, headless: real subprocesses, real store."""

from __future__ import annotations

import json

import pytest

from ptdash.shared import rundir
from ptdash.shared.reader import StoreReader
from support.runner import REPO, SCRIPTS, ptdash


def test_basic_example_records_every_step_bit_identical(tmp_path):
    loss_file = tmp_path / "losses.txt"
    # --overhead-budget 100: every statistic on every step, so every step has its norm
    # (under the default budget a fast step's norms are sampled: tests/integration/test_budget.py).
    result = ptdash("--headless", "--run-dir", "run", "--overhead-budget", "100", str(REPO / "examples" / "basic.py"),
                    "--steps", "120", "--loss-file", str(loss_file), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    expected = [float(line) for line in loss_file.read_text().split()]
    assert len(expected) == 120
    with StoreReader(tmp_path / "run" / "metrics.db") as store:
        steps, losses = store.series("loss")
        assert steps == list(range(1, 121))
        assert losses == expected  # bit-identical: the same float32 values, no rounding
        for name in ("opt/lr/group0", "grad/norm_total", "time/step_s"):
            s, v = store.series(name)
            assert s == steps, name
            assert all(x is not None and x >= 0 for x in v), name
    info = rundir.read_info(tmp_path / "run")
    assert info.status == "finished" and info.exit_code == 0
    assert info.argv[0].endswith("basic.py") and info.torch_version
    assert "finished (exit code 0)" in result.stdout


def test_script_sees_python_like_argv_path_and_cwd(tmp_path):
    project = tmp_path / "proj"
    project.mkdir()
    (project / "helper.py").write_text("VALUE = 42\n")
    (project / "show.py").write_text(
        "import os, sys\nfrom helper import VALUE\n"
        "print('ARGV', sys.argv)\nprint('NAME', __name__)\nprint('CWD', os.getcwd())\nprint('VALUE', VALUE)\n")
    result = ptdash("--headless", "proj/show.py", "--lr", "0.1", "--name=x y", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "ARGV ['proj/show.py', '--lr', '0.1', '--name=x y']" in result.stdout
    assert "NAME __main__" in result.stdout
    assert f"CWD {tmp_path}" in result.stdout
    assert "VALUE 42" in result.stdout


def test_a_directory_or_zip_with_a_main_runs_as_python_runs_it(tmp_path):
    import zipfile

    app = tmp_path / "app"
    app.mkdir()
    (app / "__main__.py").write_text("import sys\nprint('APP', __name__, sys.argv[1:])\n")
    result = ptdash("--headless", "app", "x", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "APP __main__ ['x']" in result.stdout
    with zipfile.ZipFile(tmp_path / "app.zip", "w") as z:
        z.write(app / "__main__.py", "__main__.py")
    result = ptdash("--headless", "app.zip", "y", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "APP __main__ ['y']" in result.stdout
    (tmp_path / "empty").mkdir()
    refused = ptdash("--headless", "empty", cwd=tmp_path)
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        "ptdash: error: cannot run 'empty': a directory without a __main__.py"]
    (app / "__main__.py").write_text("print(\n")
    refused = ptdash("--headless", "app", cwd=tmp_path)
    assert refused.returncode == 1 and "syntax error in" in refused.stderr and "__main__.py, line 1" in refused.stderr


def test_module_mode(tmp_path):
    (tmp_path / "pkgmod.py").write_text("import sys\nprint('MOD', __name__, sys.argv[1:])\n")
    result = ptdash("--headless", "-m", "pkgmod", "a", "b", "--n", "5", "-h", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "MOD __main__ ['a', 'b', '--n', '5', '-h']" in result.stdout


def test_the_scripts_options_are_never_taken_for_ptdashs(tmp_path):
    # "--n" is a prefix of --name and --nproc-per-node, "--s" of --steps and more: the
    # script's own, however they read, as "--h" and "-h" are.
    (tmp_path / "opts.py").write_text("import sys\nprint('ARGV', sys.argv[1:])\n")
    result = ptdash("--headless", "opts.py", "--n", "5", "--s=3", "--st", "-h", "--", "--headless", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ARGV ['--n', '5', '--s=3', '--st', '-h', '--', '--headless']" in result.stdout
    # ptdash's own options are spelled out: an abbreviation before the script is refused in one line.
    refused = ptdash("--headless", "--overhead", "5", "opts.py", cwd=tmp_path)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert "unrecognized arguments: --overhead" in refused.stderr


def test_a_headless_run_reads_ptdashs_stdin_as_python_would(tmp_path):
    (tmp_path / "ask.py").write_text("import sys\nline = input('n? ')\nprint('GOT', repr(line), repr(sys.stdin.read()))\n")
    result = ptdash("--headless", "ask.py", cwd=tmp_path, input="3\nrest\n")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "GOT '3' 'rest\\n'" in result.stdout


def test_a_script_leaving_through_os_exit_keeps_its_output_steps_and_end(tmp_path):
    # os._exit skips python's cleanup, the engine's with it: what the script printed sat in
    # the output relay's pipe and was lost, the last steps were never flushed, and the run
    # read "crashed". Its forked DataLoader workers leave through os._exit too, untouched.
    (tmp_path / "hard.py").write_text(
        "import os, sys, torch\n"
        "from torch.utils.data import DataLoader, TensorDataset\n"
        "model = torch.nn.Linear(4, 1)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "data = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=2, num_workers=2)\n"
        "for i, (x, y) in enumerate(data, 1):\n"
        "    opt.zero_grad()\n"
        "    torch.nn.functional.mse_loss(model(x), y).backward()\n"
        "    opt.step()\n"
        "print('trained', i, flush=True)\n"
        "sys.stderr.write('leaving hard\\n')\n"
        "sys.stderr.flush()\n"
        "os._exit(int(sys.argv[1]))\n")
    for code, state in ((0, "finished"), (3, "crashed")):
        result = ptdash("--headless", "--run-dir", f"run{code}", "hard.py", str(code), cwd=tmp_path)
        assert result.returncode == code, result.stdout + result.stderr
        assert "trained 32" in result.stdout and "leaving hard" in result.stdout
        log = (tmp_path / f"run{code}" / "output.log").read_text()
        assert "trained 32" in log and "leaving hard" in log
        info = rundir.read_info(tmp_path / f"run{code}")
        assert (info.status, info.exit_code) == (state, code)
        with StoreReader(tmp_path / f"run{code}" / "metrics.db") as store:
            assert store.series("loss")[0] == list(range(1, 33))


def test_exit_code_passthrough(tmp_path):
    (tmp_path / "three.py").write_text("import sys\nprint('bye')\nsys.exit(3)\n")
    result = ptdash("--headless", "--run-dir", "run", "three.py", cwd=tmp_path)
    assert result.returncode == 3
    info = rundir.read_info(tmp_path / "run")
    assert info.exit_code == 3 and info.status == "crashed"


def test_crash_is_recorded_with_traceback(tmp_path):
    (tmp_path / "boom.py").write_text("def f():\n    raise RuntimeError('kaboom')\nf()\n")
    result = ptdash("--headless", "--run-dir", "run", "boom.py", cwd=tmp_path)
    assert result.returncode == 1
    log = (tmp_path / "run" / "output.log").read_text()
    # As python prints it: the script's frames under its absolute path (3.9+), none of ptdash's.
    assert "RuntimeError: kaboom" in log and f'File "{tmp_path / "boom.py"}", line 2, in f' in log
    assert "bootstrap.py" not in log and "ptdash" not in log.replace(str(tmp_path), "")
    info = rundir.read_info(tmp_path / "run")
    assert info.status == "crashed"


def _one_line_error(result, code, *needles):
    assert result.returncode == code, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("ptdash: error: ")
    for needle in needles:
        assert needle in lines[0]
    assert not (result.stdout.strip())


def test_missing_script_is_one_line(tmp_path):
    _one_line_error(ptdash("nope.py", cwd=tmp_path), 2, "nope.py", "no such file")
    assert not (tmp_path / "ptdash-runs").exists()  # nothing created for a bad command


def test_syntax_error_is_one_line(tmp_path):
    (tmp_path / "bad.py").write_text("x = 1\ndef f(:\n")
    _one_line_error(ptdash("bad.py", cwd=tmp_path), 1, "bad.py", "line 2")


def test_unknown_option_is_one_line(tmp_path):
    _one_line_error(ptdash("--frobnicate", "x.py", cwd=tmp_path), 2, "--frobnicate")


def test_bad_option_values_are_refused(tmp_path):
    (tmp_path / "ok.py").write_text("pass\n")
    _one_line_error(ptdash("--clip", "-1", "ok.py", cwd=tmp_path), 2, "clip norm")
    _one_line_error(ptdash("--clip", "nan", "ok.py", cwd=tmp_path), 2, "clip norm")
    _one_line_error(ptdash("--resume", "missing.pt", "ok.py", cwd=tmp_path), 2, "missing.pt")


def test_version_and_help(tmp_path):
    result = ptdash("--version", cwd=tmp_path)
    assert result.returncode == 0 and result.stdout.startswith("ptdash ")
    result = ptdash("--help", cwd=tmp_path)
    assert result.returncode == 0 and "script.py" in result.stdout and "--headless" in result.stdout


def test_closure_optimizer_and_grad_accumulation(tmp_path):
    result = ptdash("--headless", "--run-dir", "run", str(SCRIPTS / "closure_accum.py"), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    expected = json.loads((tmp_path / "expected.json").read_text())
    with StoreReader(tmp_path / "run" / "metrics.db") as store:
        steps, losses = store.series("loss")
        _, micro = store.series("loss/micro_batches")
    # 10 accumulation steps (4 micro-batches each) with AdamW, then 5 LBFGS steps.
    assert steps == list(range(1, 16))
    assert losses[:10] == expected["accum"]
    assert micro[:10] == [4.0] * 10
    assert losses[10:] == expected["lbfgs"]


def test_gradscaler_losses_are_unscaled_and_skipped_steps_leave_nothing(tmp_path):
    result = ptdash("--headless", "--run-dir", "run", str(SCRIPTS / "amp_scaler.py"), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    taken = json.loads((tmp_path / "taken.json").read_text())
    skipped = 30 - len(taken)
    assert skipped >= 1, result.stdout  # the huge initial scale overflowed the first step
    with StoreReader(tmp_path / "run" / "metrics.db") as store:
        steps, losses = store.series("loss")
        _, norms = store.series("grad/norm_total")
    assert steps == list(range(1, len(taken) + 1))
    assert losses == taken  # unscaled, and no skipped iteration's loss leaked into a step
    assert all(n is not None and n < 1e6 for n in norms)  # unscaled gradient norms


@pytest.fixture
def project(tmp_path):
    (tmp_path / "ok.py").write_text("print('ran')\n")
    (tmp_path / "afile").write_text("")
    return tmp_path


@pytest.mark.parametrize("options, needle", [
    (["--run-dir", "afile"], "--run-dir afile exists and is not a directory"),
    (["--run-dir", "/dev/null"], "--run-dir /dev/null exists and is not a directory"),
    (["--run-dir", "/sys/ptdash-run"], "is on sysfs, a kernel file system"),
    (["--run-dir", "/proc/self/ptdash-run"], "is on proc, a kernel file system"),
    (["--run-dir", "afile/run"], "afile is not a directory"),
    (["--run-dir", "run\udcff"], "run\\xff is not a UTF-8 path"),  # the bytes b"run\xff" on the command line
    (["--keep-last", "0"], "argument --keep-last: takes a whole number >= 1, got '0'"),
    (["--keep-last", "-3"], "argument --keep-last: takes a whole number >= 1, got '-3'"),
    (["--nproc-per-node", "0"], "argument --nproc-per-node: takes a whole number >= 1, got '0'"),
    (["--nproc-per-node", "-2"], "argument --nproc-per-node: takes a whole number >= 1"),
    (["--update-ratio-every", "-1"], "argument --update-ratio-every: takes a whole number >= 0"),
    (["--overhead-budget", "0"], "argument --overhead-budget: overhead budget must be"),
    (["--overhead-budget", "150"], "overhead_budget is a percentage, at most 100, got 150.0"),
    (["--lr-scale", "1e308"], "LR factor must be from 1e-6 to 1000, got '1e308'"),
    (["--clip", "1e309"], "clip norm must be a finite number > 0"),
    (["--profile-steps", "1:5000"], "a profile is a whole number of steps from 1 to 1000"),
    (["--share-group", "no-such-group-here"], "--share-group: no group named 'no-such-group-here'"),
])
def test_every_bad_run_option_is_one_line_exit_2_and_creates_nothing(project, options, needle):
    before = sorted(p.name for p in project.iterdir())
    _one_line_error(ptdash("--headless", *options, "ok.py", cwd=project), 2, needle)
    assert sorted(p.name for p in project.iterdir()) == before  # no ptdash-runs, no run dir


@pytest.mark.parametrize("module, needle", [
    ("no.such.module", "no module named 'no.such.module'"),
    ("json", "'json' is a package without a __main__ module"),
    ("pkg.missing", "no module named 'pkg.missing'"),
    ("1abc", "-m '1abc' is not a module name"),
])
def test_a_module_that_cannot_run_is_one_line_exit_2_and_creates_nothing(project, module, needle):
    (project / "pkg").mkdir()
    (project / "pkg" / "__init__.py").write_text("print('INIT RAN')\n")
    _one_line_error(ptdash("--headless", "-m", module, cwd=project), 2, needle)
    assert not (project / "ptdash-runs").exists()


def test_the_module_check_runs_none_of_the_packages_code(project):
    (project / "pkg").mkdir()
    (project / "pkg" / "__init__.py").write_text("print('INIT RAN')\n")
    (project / "pkg" / "__main__.py").write_text("print('MAIN RAN')\n")
    result = ptdash("--headless", "-m", "pkg", cwd=project)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("INIT RAN") == 1 and "MAIN RAN" in result.stdout  # the engine's run only


def test_a_runs_directory_under_a_non_utf8_path_is_one_line_and_creates_nothing(project):
    odd = project / "d\udcff"  # a directory whose name is the bytes b"d\xff"
    odd.mkdir()
    (odd / "ok.py").write_text("print('ran')\n")
    _one_line_error(ptdash("--headless", "ok.py", cwd=odd), 2, "d\\xff/ptdash-runs is not a UTF-8 path")
    assert list(odd.iterdir()) == [odd / "ok.py"]


def test_a_runs_directory_that_is_a_file_is_one_line(project):
    (project / "ptdash-runs").write_text("")
    _one_line_error(ptdash("--headless", "ok.py", cwd=project), 2,
                    "the runs directory ptdash-runs exists and is not a directory")
