"""Import hygiene of the terminal side, checked in a fresh interpreter (harlequin style).

Every tui module stays clear of torch; every module but the Textual front (the app, its
messages, its command keys and the widgets) also stays clear of Textual, so the sources, state, tabs and
commands can be used by scripts and tested without an app. The modules are found by
walking ``ptdash.tui``, so a new one is checked without being listed here.
"""

import pkgutil
import subprocess
import sys

import ptdash.tui

TEXTUAL_FRONT = ("ptdash.tui.app", "ptdash.tui.commands", "ptdash.tui.messages", "ptdash.tui.widgets")
"""The modules (and the package) allowed to import Textual."""

MODULES = ["ptdash.tui", *(m.name for m in pkgutil.walk_packages(ptdash.tui.__path__, prefix="ptdash.tui."))]
HEADLESS = [m for m in MODULES if not any(m == front or m.startswith(front + ".") for front in TEXTUAL_FRONT)]

_FIRST_TO_LOAD = """
import sys
for name in sys.argv[2:]:
    __import__(name)
    if any(m == sys.argv[1] or m.startswith(sys.argv[1] + ".") for m in sys.modules):
        print(name)
        break
"""


def first_to_load(package: str, modules: list[str]) -> str | None:
    """The first of ``modules`` whose import (in that order, in a fresh interpreter) loads ``package``."""
    out = subprocess.run([sys.executable, "-c", _FIRST_TO_LOAD, package, *modules], capture_output=True, text=True,
                         check=True)
    return out.stdout.strip() or None


def test_the_walk_finds_both_halves_of_the_terminal_side():
    assert {"ptdash.tui.state", "ptdash.tui.cli", "ptdash.tui.tabs.doctor"} <= set(HEADLESS)
    assert {"ptdash.tui.app", "ptdash.tui.widgets.header"} <= set(MODULES) - set(HEADLESS)


def test_dashboard_never_imports_torch():
    leak = first_to_load("torch", MODULES)
    assert leak is None, f"importing {leak} loads torch"


def test_headless_modules_never_import_textual():
    leak = first_to_load("textual", HEADLESS)
    assert leak is None, f"importing {leak} loads textual (only {', '.join(TEXTUAL_FRONT)} may)"
