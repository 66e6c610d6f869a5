"""Import hygiene of the terminal side, checked in a fresh interpreter (harlequin style).

Every tui module stays clear of torch; the headless ones (sources, state, chart maths)
also stay clear of Textual, so they can be used by scripts and tested without an app.
"""

import subprocess
import sys

HEADLESS = ["ptdash.tui.source", "ptdash.tui.state", "ptdash.tui.chart", "ptdash.tui.panels", "ptdash.tui.layers",
            "ptdash.tui.bars", "ptdash.tui.system", "ptdash.tui.profile", "ptdash.tui.ranks", "ptdash.tui.findings"]
WIDGETS = ["ptdash.tui.app", "ptdash.tui.messages", "ptdash.tui.widgets.chart_panel", "ptdash.tui.widgets.header",
           "ptdash.tui.widgets.overview", "ptdash.tui.widgets.log_pane", "ptdash.tui.widgets.events_pane",
           "ptdash.tui.widgets.quit_dialog", "ptdash.tui.widgets.stop_dialog", "ptdash.tui.widgets.value_dialog",
           "ptdash.tui.widgets.help_screen", "ptdash.tui.widgets.layers_view", "ptdash.tui.widgets.layer_table",
           "ptdash.tui.widgets.report_view", "ptdash.tui.widgets.oom_screen",
           "ptdash.tui.widgets.ranks_view"]


def _modules_after(imports: list[str]) -> set[str]:
    code = f"import sys; import {', '.join(imports)}; print(' '.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_dashboard_never_imports_torch():
    loaded = _modules_after(HEADLESS + WIDGETS)
    assert "torch" not in loaded


def test_headless_modules_never_import_textual():
    loaded = _modules_after(HEADLESS)
    assert not any(m == "textual" or m.startswith("textual.") for m in loaded)
