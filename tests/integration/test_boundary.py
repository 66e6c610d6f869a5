"""The three layers stay apart, with every module found by walking the packages.

- ``ptdash.shared`` (the contract) uses the standard library only;
- the terminal side (``ptdash.tui``) imports nothing of the training side but the
  shared package, and never loads torch;
- the training side never loads textual.

Each side is imported whole in a fresh interpreter (nothing another test imported can
hide a leak), and every import statement of the shared and terminal modules is also read
from source, so an import inside a function cannot slip past either.
"""

from __future__ import annotations

import ast
import importlib.util
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import ptdash
import ptdash.shared
import ptdash.tui


def _modules(package) -> list[str]:
    found = [package.__name__]
    for info in pkgutil.walk_packages(package.__path__, prefix=package.__name__ + "."):
        found.append(info.name)
    return found


SHARED = _modules(ptdash.shared)
TERMINAL = _modules(ptdash.tui)
TRAINING = [m for m in _modules(ptdash) if m not in SHARED and not m.startswith("ptdash.tui")
            and not m.startswith("ptdash.demo")]


def _loaded_after_import(modules: list[str]) -> set[str]:
    """The modules that importing ``modules`` adds to what the interpreter starts with."""
    code = ("import sys\nbefore = set(sys.modules)\nfor m in sys.argv[1:]:\n    __import__(m)\n"
            "print(' '.join(set(sys.modules) - before))")
    out = subprocess.run([sys.executable, "-c", code, *modules], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def _imports_in_source(module: str) -> list[tuple[str, int]]:
    """Every module an import statement of ``module`` names (absolute), with its line."""
    spec = importlib.util.find_spec(module)
    path = Path(spec.origin)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
            found += [(f"{base}.{alias.name}", node.lineno) for alias in node.names]
            found.append((base, node.lineno))
    return found


def test_the_walk_finds_every_layer():
    assert "ptdash.shared.protocol" in SHARED and "ptdash.tui.cli" in TERMINAL and "ptdash.engine" in TRAINING


def test_the_shared_package_loads_the_standard_library_only():
    loaded = _loaded_after_import(SHARED)
    foreign = {m.split(".")[0] for m in loaded} - set(sys.stdlib_module_names) - {"ptdash"}
    assert not foreign, f"the shared package pulled in {sorted(foreign)}"
    outside = {m for m in loaded if m.startswith("ptdash.") and not m.startswith("ptdash.shared")}
    assert not outside, f"the shared package imports the training side: {sorted(outside)}"


@pytest.mark.parametrize("module", SHARED)
def test_shared_sources_import_nothing_outside_the_standard_library(module):
    for name, line in _imports_in_source(module):
        top = name.split(".")[0]
        if top == "ptdash":
            assert name == "ptdash" or name.startswith("ptdash.shared"), f"{module}:{line} imports {name}"
        elif top != "__future__":
            assert top in sys.stdlib_module_names, f"{module}:{line} imports {name}"


def test_the_terminal_side_never_loads_torch():
    loaded = _loaded_after_import(TERMINAL)
    assert "torch" not in loaded
    training = {m for m in loaded if m.startswith("ptdash.") and not m.startswith(("ptdash.shared", "ptdash.tui"))}
    assert not training, f"the terminal side loaded {sorted(training)}"


@pytest.mark.parametrize("module", TERMINAL)
def test_terminal_sources_import_only_the_shared_package_of_the_training_side(module):
    for name, line in _imports_in_source(module):
        if name.split(".")[0] == "torch":
            raise AssertionError(f"{module}:{line} imports {name}")
        if name.startswith("ptdash") and name != "ptdash":
            assert name.startswith(("ptdash.shared", "ptdash.tui")), f"{module}:{line} imports {name}"


def test_the_training_side_never_loads_textual():
    loaded = _loaded_after_import(TRAINING)
    assert not any(m == "textual" or m.startswith("textual.") for m in loaded)
    assert not any(m.startswith("ptdash.tui") for m in loaded)
