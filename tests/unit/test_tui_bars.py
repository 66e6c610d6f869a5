"""One-line glyph drawings: sparklines (NaN marks, log scale), bars and stacked bars."""

from __future__ import annotations

from ptdash.tui.bars import bar, sparkline, stacked


def test_sparkline_and_bars():
    line = sparkline([1.0, 2.0, None, 4.0], 6)
    assert line.plain == "  ▁▃×█" and len(line) == 6
    assert sparkline([5.0, 5.0], 3).plain == " ▄▄"
    assert sparkline([1e-3, 1e-2, 1e-1], 3, log=True).plain == "▁▅█"
    assert bar(0.5, 10).plain == "█████░░░░░"
    assert bar(None, 4).plain == "░░░░"
    assert bar(2.0, 4).plain == "████"
    assert stacked([(0.25, "a"), (0.25, "b"), (None, "c")], 8).plain == "████░░░░"
    assert stacked([(0.01, "a")], 8).plain[0] != "░"  # a sliver, never nothing
