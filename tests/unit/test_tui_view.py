"""ChartView: what the chart keys do to the step range, the cursor, the smoothing and the scale."""

from ptdash.tui.view import MIN_SPAN, SMOOTHING, ChartView


def test_zoom_in_follows_the_newest_steps_and_zoom_out_returns():
    view = ChartView()
    assert view.window(1, 1000) is None and not view.can("zoom_out")
    view.apply("zoom_in", 1, 1000)
    assert view.window(1, 1000) == (501, 1000)
    assert view.window(1, 1200) == (701, 1200)  # new steps: the range follows them
    view.apply("zoom_in", 1, 1000)
    assert view.window(1, 1000) == (751, 1000)
    view.apply("zoom_out", 1, 1000)
    view.apply("zoom_out", 1, 1000)
    assert view.window(1, 1000) is None


def test_zoom_never_goes_below_a_few_steps():
    view = ChartView()
    for _ in range(20):
        view.apply("zoom_in", 1, 1000)
    lo, hi = view.window(1, 1000)
    assert hi - lo == MIN_SPAN


def test_pan_moves_back_and_on_then_follows_again():
    view = ChartView()
    view.apply("zoom_in", 1, 1000)
    assert not view.can("on")
    view.apply("back", 1, 1000)
    assert view.window(1, 1000) == (377, 876) and view.can("on")
    assert view.window(1, 2000) == (377, 876)  # panned back: it stays put while the run goes on
    for _ in range(10):
        view.apply("back", 1, 1000)
    assert view.window(1, 1000) == (1, 500)
    for _ in range(10):
        view.apply("on", 1, 1000)
    assert view.end is None and view.window(1, 1000) == (501, 1000)
    view.apply("reset", 1, 1000)
    assert view.window(1, 1000) is None


def test_zoom_centres_on_the_cursor():
    view = ChartView()
    view.apply("right", 1, 1000)
    assert view.cursor == 1000
    for _ in range(30):
        view.apply("far_left", 1, 1000)
    assert view.cursor == 1
    for _ in range(3):
        view.apply("far_right", 1, 1000)
    assert view.cursor == 271  # ten steps of 1/100 of the range each
    view.apply("zoom_in", 1, 1000)
    assert view.window(1, 1000) == (21, 520)


def test_the_cursor_goes_on_to_the_schedule_ahead_and_a_zoomed_range_follows_it():
    view = ChartView()
    view.apply("right", 1, 1000, 3000)
    view.apply("far_right", 1, 1000, 3000)
    assert view.cursor == 1290  # past the recorded steps: on the schedule ahead
    view.apply("hide", 1, 1000)
    assert view.cursor is None and not view.can("hide")
    view.apply("zoom_in", 1, 1000)
    view.apply("back", 1, 1000)
    view.apply("left", 1, 1000)  # shows the cursor at the newest step in view
    assert view.cursor == 876
    for _ in range(40):
        view.apply("right", 1, 1000)
    assert view.window(1, 1000) == (501, 1000)  # followed it back to the newest steps


def test_smoothing_and_scale_cycle():
    view = ChartView()
    seen = []
    for _ in range(len(SMOOTHING)):
        view.apply("smooth", 1, 10)
        seen.append(view.smoothing)
    assert sorted(seen) == sorted(SMOOTHING) and view.smoothing == 0.95
    assert [view.log_y("auto")] == ["auto"]
    view.apply("scale", 1, 10)
    assert view.log_y("auto") is True and view.log_y(False) is True
    view.apply("scale", 1, 10)
    assert view.log_y("auto") is False
    view.apply("scale", 1, 10)
    assert view.scale == "auto"
