"""Pure dashboard state: decimation, smoothing, buffers, rates, formatting."""


import pytest

from ptdash.shared.protocol import Ack, Event, Metrics, Status
from ptdash.tui.state import (
    RunState,
    Series,
    StepRate,
    command_text,
    eta,
    fmt_bytes,
    fmt_duration,
    fmt_si,
)


def test_series_decimates_after_the_fact_and_ignores_old_rows():
    series = Series(cap=100)
    series.extend(list(range(150)), [float(i) for i in range(150)])
    assert len(series) <= 100
    assert series.steps[0] == 0 and series.last_step == 149
    version = series.version
    series.extend([3, 4], [0.0, 0.0])  # older than the last step: ignored
    assert series.last_step == 149
    series.append(150, None)
    assert series.latest() is None and series.version > version


def test_series_merge_fills_gaps_in_order():
    series = Series()
    series.extend([1, 2, 6], [1.0, 2.0, 6.0])
    series.merge([3, 4, 5, 6], [3.0, 4.0, 5.0, 99.0])
    assert series.steps == [1, 2, 3, 4, 5, 6]
    assert series.values[-1] == 6.0  # existing steps win


def test_step_rate_uses_recent_walls():
    rate = StepRate(window_s=10)
    assert rate.rate() is None
    for s in range(100):
        rate.add(s, 1000.0 + s * 0.5)  # 2 steps/s
    assert rate.rate() == pytest.approx(2.0)
    rate.add(100, 1000.0 + 99 * 0.5 + 10)  # a slow step
    assert rate.rate() < 2.0


def test_run_state_folds_messages():
    state = RunState()
    state.add_metrics(Metrics(rows=[[1, 10.0, {"loss": 2.0}], [2, 10.5, {"loss": None, "opt/lr/group0": 0.1}]]))
    state.add_metrics(Metrics(rows=[[3, 11.0, {"loss": 1.0}]], rank=1))  # other ranks are not charted
    assert state.series["loss"].steps == [1, 2]
    assert state.series["opt/lr/group0"].values == [0.1]
    assert state.rate.rate() == pytest.approx(2.0)
    line = state.add_ack(Ack(id="a", name="clip", ok=True, step=540), "clip 0.5")
    assert line.text == "step 540 clip 0.5 applied" and line.level == "ok"
    bad = state.add_ack(Ack(id="b", name="clip", ok=False, message="no"), "clip 5")
    assert bad.level == "error" and "refused: no" in bad.text
    # The command event of an ack already shown is not shown twice.
    assert state.add_event(Event(kind="command", step=540, wall=1.0, message="x", data={"id": "a"})) is None
    event = state.add_event(Event(kind="anomaly", step=7, wall=1.0, message="nan loss"))
    assert event.level == "error" and event.text == "step 7 anomaly: nan loss"
    state.status = Status(state="finished", step=3, exit_code=0)
    assert state.ended


@pytest.mark.parametrize("seconds, text", [
    (None, "—"), (-1, "—"), (0, "0s"), (45.4, "45s"), (185, "3m05s"), (3720, "1h02m"), (183600, "2d03h"),
])
def test_fmt_duration(seconds, text):
    assert fmt_duration(seconds) == text


@pytest.mark.parametrize("value, text", [
    (None, "N/A"), (0, "0"), (950, "950"), (12_345, "12.3k"), (1_234_567, "1.23M"), (3e9, "3G"),
    (0.123, "0.123"), (0.0123, "0.0123"), (3e-4, "3e-4"), (2.5e-5, "2.5e-5"), (-0.00042, "-4.2e-4"),
    (999.8, "1k"), (float("inf"), "inf"), (100, "100"), (123.456, "123"), (1.5, "1.5"),
])
def test_fmt_si(value, text):
    assert fmt_si(value) == text


def test_fmt_si_digits():
    assert fmt_si(100, 2) == "100"
    assert fmt_si(2.7994, 4) == "2.799"
    assert fmt_si(0.0027994, 2) == "2.8e-3"


@pytest.mark.parametrize("value, text", [
    (None, "N/A"), (512, "512 B"), (1536, "1.5 KiB"), (3.5 * 2**30, "3.5 GiB"), (2**50, "1024.0 TiB"),
])
def test_fmt_bytes(value, text):
    assert fmt_bytes(value) == text


def test_eta():
    assert eta(500, 2000, 10.0) == 150.0
    assert eta(2500, 2000, 10.0) == 0
    assert eta(500, None, 10.0) is None
    assert eta(500, 2000, None) is None
    assert eta(500, 2000, 0.0) is None


def test_command_text():
    assert command_text("clip", 0.5) == "clip 0.5"
    assert command_text("clip", None) == "clip off"
    assert command_text("lr_scale", 0.25) == "LR ×0.25"
    assert command_text("profile", 5) == "profile 5 steps"
    assert command_text("pause", None) == "pause"
