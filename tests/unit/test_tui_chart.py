"""The braille chart renderer, drawn without an app."""

import math

from rich.console import Console

from ptdash.tui.chart import BRAILLE_BASE, Chart, Line, log_ticks, nice_ticks, render, tick_label, to_text


def dots(char: str) -> int:
    return ord(char) - BRAILLE_BASE if BRAILLE_BASE <= ord(char) < BRAILLE_BASE + 256 else 0


def plot_cells(rows, label_w):
    """The plot area of rendered rows (label and axis stripped), x-axis row excluded."""
    return [line[label_w + 1:] for line in to_text(rows)[:-1]]


def test_diagonal_line_sets_one_dot_per_pixel_column():
    rows = render(Chart([Line([0, 1], [0.0, 1.0])]), 12, 3)
    text = to_text(rows)
    assert [len(line) for line in text] == [12, 12, 12]
    assert text[0].startswith("1┤") and text[1].startswith("0┤")
    cells = plot_cells(rows, 1)  # 10 cells x 2 rows = 20 x 8 pixels
    # (0, 0) is the bottom-left pixel, (1, 1) the top-right one.
    assert dots(cells[1][0]) & 0x40
    assert dots(cells[0][-1]) & 0x08
    # A shallow Bresenham line lights exactly one pixel in each of the 20 columns...
    per_column = []
    for px in range(20):
        col, bit_col = px // 2, px % 2
        lit = [r * 4 + y for r in range(2) for y in range(4)
               if dots(cells[r][col]) & ((0x01, 0x02, 0x04, 0x40)[y] if bit_col == 0 else (0x08, 0x10, 0x20, 0x80)[y])]
        per_column.append(lit)
    assert all(len(lit) == 1 for lit in per_column)
    # ...climbing from the bottom row of pixels to the top one.
    heights = [lit[0] for lit in per_column]
    assert heights[0] == 7 and heights[-1] == 0
    assert heights == sorted(heights, reverse=True)


def test_flat_line_sits_mid_height():
    rows = render(Chart([Line([0, 10], [2.0, 2.0])]), 20, 2)
    plot = to_text(rows)[0]
    assert "⠤⠤⠤⠤" in plot  # dots 3 and 6: the third pixel row of four


def test_x_axis_labels_steps():
    rows = render(Chart([Line(list(range(0, 1001)), [float(i) for i in range(1001)])]), 60, 8)
    axis = to_text(rows)[-1]
    for label in ("0", "200", "400", "600", "800", "1k"):
        assert f" {label}" in f" {axis} "
    assert axis.index("200") < axis.index("400")


def test_y_labels_are_nice_ticks():
    rows = render(Chart([Line([0, 1, 2], [0.13, 2.47, 1.0])]), 40, 9)
    labels = [line.split("┤")[0].strip() for line in to_text(rows) if "┤" in line]
    assert labels == ["2.5", "2.0", "1.5", "1.0", "0.5"]  # 4% headroom reaches 2.56


def test_log_scale_labels_decades():
    steps = list(range(1000))
    values = [1000.0 * math.exp(-i / 150) + 1 for i in steps]
    rows = render(Chart([Line(steps, values)], log_y="auto"), 50, 10)
    labels = [line.split("┤")[0].strip() for line in to_text(rows) if "┤" in line]
    assert labels == ["1k", "100", "10"]


def test_none_breaks_the_line():
    steps = list(range(100))
    values = [None if 40 <= i < 60 else 1.0 + (i % 2) for i in steps]
    rows = render(Chart([Line(steps, values)]), 52, 4)
    cells = plot_cells(rows, 1)
    middle = [row[21:29] for row in cells]  # columns well inside steps 40..59
    assert all(set(part) <= {" "} for part in middle)


def test_hline_and_colours():
    chart = Chart([Line([0, 100], [0.0, 1.0], "green")], hlines=[(0.5, "red")])
    rows = render(chart, 30, 5)
    styles = {str(seg.style) for row in rows for seg in row if seg.style is not None and dots(seg.text[:1])}
    assert "green" in styles and "red" in styles


def test_empty_chart_says_waiting():
    text = to_text(render(Chart(), 40, 5))
    assert any("waiting for data" in line for line in text)
    assert all(len(line) == 40 for line in text)


def test_renders_as_rich_renderable_at_console_size():
    console = Console(width=50, record=True, file=open("/dev/null", "w"), color_system=None)
    console.print(Chart([Line([0, 1, 2], [1.0, 3.0, 2.0])], height=6))
    lines = console.export_text().splitlines()
    assert len(lines) == 6 and all(len(line) <= 50 for line in lines)


def test_100k_points_are_reduced_per_pixel_column_not_drawn_one_by_one(monkeypatch):
    """What keeps a long run's chart fast, checked by the work done rather than the time it
    takes: on a log axis each point would cost a log10 on the per-point path; reduced per
    column, a line costs a few per pixel column (its ends, its extremes, the ticks), however
    many points it holds."""
    from ptdash.tui import chart as chart_module

    calls = []

    class CountingMath:
        def __getattr__(self, name):
            return getattr(math, name)

        def log10(self, value):
            calls.append(value)
            return math.log10(value)

    steps = list(range(100_000))
    values = [3 * math.exp(-i / 20_000) + 0.1 * math.sin(i) + 0.2 for i in steps]
    chart = Chart([Line(steps, values, "grey50"), Line(steps, values, "cyan")], log_y=True)
    monkeypatch.setattr(chart_module, "math", CountingMath())
    rows = render(chart, 200, 20)
    assert len(rows) == 20
    assert 0 < len(calls) < 20 * 200, len(calls)  # 200k on the per-point path


def test_nice_ticks():
    assert nice_ticks(0, 1, 6) == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert nice_ticks(0.13, 2.47, 5) == [0.5, 1.0, 1.5, 2.0]
    assert nice_ticks(-3, 3, 3) == [-2.5, 0.0, 2.5] or nice_ticks(-3, 3, 3) == [-2.0, 0.0, 2.0]
    assert nice_ticks(5, 5, 4) == [5]


def test_log_ticks():
    assert log_ticks(0.01, 10, 5) == [0.01, 0.1, 1.0, 10.0]
    assert log_ticks(1, 10, 5) == [1.0, 2.0, 5.0, 10.0]
    assert log_ticks(0, 10, 5) == []


def test_tick_label():
    assert tick_label(0, 0.5) == "0"
    assert tick_label(0.5, 0.5) == "0.5"
    assert tick_label(1.0, 0.5) == "1.0"
    assert tick_label(2e-4, 1e-4) == "2e-4"
    assert tick_label(2.5e-4, 5e-5) == "2.5e-4"
    assert tick_label(1500, 500) == "1.5k"


def test_dashed_line_is_drawn_between_sparse_points():
    rows = render(Chart([Line([0, 3, 6, 9], [1.0, 1.0, 1.0, 1.0], "red", dashed=True)]), 42, 2)
    plot = to_text(rows)[0].split("┤", 1)[-1] if "┤" in to_text(rows)[0] else to_text(rows)[0][2:]
    lit = [i for i, ch in enumerate(plot) if dots(ch)]
    assert len(lit) >= len(plot) // 2 - 1  # every other cell, all the way across
    assert lit[0] <= 1 and lit[-1] >= len(plot) - 2


def test_x_range_shows_only_those_steps_and_fits_the_y_axis_to_them():
    steps = list(range(1000))
    values = [float(i) for i in steps]
    rows = render(Chart([Line(steps, values)], x_range=(900, 999)), 60, 8)
    text = to_text(rows)
    labels = [line.split("┤")[0].strip() for line in text if "┤" in line]
    assert float(labels[-1]) >= 890  # the y axis is the zoomed range's, not 0..1000
    assert "900" in text[-1] and "200" not in text[-1]


def test_cursor_is_a_dotted_column():
    line = Line([0, 100], [1.0, 1.0])
    plain = to_text(render(Chart([line]), 40, 6))[:-1]
    with_cursor = to_text(render(Chart([line], cursor=50), 40, 6))[:-1]
    changed = {i for a, b in zip(plain, with_cursor) for i, (x, y) in enumerate(zip(a, b)) if x != y}
    assert len(changed) == 1  # one column...
    (col,) = changed
    assert all(dots(row[col]) for row in with_cursor)  # ...lit from top to bottom
