"""The two halves stay apart: the terminal side never loads torch, the engine never loads
textual. Checked in fresh interpreters so nothing imported by other tests can hide a leak."""

import subprocess
import sys

import pytest

TERMINAL_SIDE = ["ptdash", "ptdash.protocol", "ptdash.store", "ptdash.transport", "ptdash.rundir",
                 "ptdash.tui", "ptdash.tui.cli", "ptdash.tui.runs", "ptdash.tui.app", "ptdash.tui.source", "ptdash.tui.doctor_cli"]
ENGINE_SIDE = ["ptdash.engine", "ptdash.hooks", "ptdash.bootstrap", "ptdash.checkpoint", "ptdash.controls",
               "ptdash.doctor", "ptdash.doctor_rules", "ptdash.distributed", "ptdash.launch"]


def _loaded(module: str, probe: str) -> bool:
    code = f"import sys, {module}; print({probe!r} in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip() == "True"


@pytest.mark.parametrize("module", TERMINAL_SIDE)
def test_terminal_side_never_imports_torch(module):
    assert not _loaded(module, "torch")


@pytest.mark.parametrize("module", ENGINE_SIDE)
def test_engine_side_never_imports_textual(module):
    assert not _loaded(module, "textual")


@pytest.mark.parametrize("module", ["ptdash.protocol", "ptdash.store", "ptdash.transport", "ptdash.rundir"])
def test_shared_modules_are_stdlib_only(module):
    code = (f"import sys; before = set(sys.modules); import {module}; "
            "new = {m.split('.')[0] for m in set(sys.modules) - before}; "
            "print(sorted(new - set(sys.stdlib_module_names) - {'ptdash'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
