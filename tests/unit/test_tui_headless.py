"""The headless progress line: step of total, values, the running rate and the ETA."""

import pytest

from ptdash.shared import names, rundir
from ptdash.shared.protocol import Event
from ptdash.shared.reader import StoreReader
from ptdash.shared.store import STORE_NAME, StoreWriter
from ptdash.tui.watch import progress_line
from support.recorded_run import make_run


def test_progress_line_has_the_total_and_an_eta_over_running_time(tmp_path):
    run_dir = make_run(tmp_path, steps=500, status="running", now=1_700_000_000.0)
    with StoreReader(run_dir / STORE_NAME) as reader:
        line = progress_line(reader, rundir.read_info(run_dir))
    assert line.startswith("[ptdash] running | step 500/2000 | loss ")
    assert "| 20.0 steps/s | ETA 1m15s" in line  # 0.05 s a step, 1500 steps to go


def test_a_pause_does_not_slow_the_rate(tmp_path):
    run_dir = make_run(tmp_path, steps=500, status="running", now=1_700_000_000.0)
    with StoreReader(run_dir / STORE_NAME) as reader:
        walls = reader.walls()[1]
    writer = StoreWriter(run_dir / STORE_NAME)
    pause, resume = walls[-1] + 0.01, walls[-1] + 600.01  # ten minutes paused after step 500
    writer.write(rows=[[501 + i, resume + 0.04 + 0.05 * i, {}] for i in range(5)], events=[
        Event(kind="command", step=500, wall=pause, message="pause", data={"name": "pause", "ok": True}),
        Event(kind="command", step=500, wall=resume, message="resume", data={"name": "resume", "ok": True})])
    writer.close()
    with StoreReader(run_dir / STORE_NAME) as reader:
        line = progress_line(reader, rundir.read_info(run_dir))
    rate = float(line.split(" steps/s")[0].rsplit("| ", 1)[1])
    assert rate == pytest.approx(20.0, rel=0.03), line


def test_slow_steps_show_seconds_per_step_and_the_latest_event(tmp_path):
    run_dir = make_run(tmp_path, steps=500, status="running", now=1_700_000_000.0)
    with StoreReader(run_dir / STORE_NAME) as reader:
        walls = reader.walls()[1]
    writer = StoreWriter(run_dir / STORE_NAME)
    writer.write(rows=[[501 + i, walls[-1] + 4.0 * (i + 1), {}] for i in range(60)])  # 4 s a step
    writer.close()
    last = Event(kind="anomaly", step=560, wall=0.0, message="loss spike at step 560: 9.1 is 4.0x its average")
    with StoreReader(run_dir / STORE_NAME) as reader:
        line = progress_line(reader, rundir.read_info(run_dir), last)
    assert "| 4.0 s/step |" in line and "steps/s" not in line, line
    assert "| ETA 1h36m |" in line  # 1440 steps to go at 4 s each
    assert line.endswith("| last: loss spike at step 560: 9.1 is 4.0x its average"), line


def test_a_paused_run_says_so_first_and_has_no_eta(tmp_path):
    run_dir = make_run(tmp_path, steps=500, status="paused", now=1_700_000_000.0)
    with StoreReader(run_dir / STORE_NAME) as reader:
        line = progress_line(reader, rundir.read_info(run_dir))
    assert line.startswith("[ptdash] paused | step 500/2000 |") and "ETA" not in line, line


def _written(monkeypatch, parts: list[tuple[str, bytes]]) -> bytes:
    import io
    import sys

    from ptdash.tui.headless import _Out

    raw = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, write_through=True))
    out = _Out()
    for kind, data in parts:
        out.script(data) if kind == "script" else out.line(data)
    sys.stdout.flush()
    return raw.getvalue()


def test_a_ptdash_line_inside_a_script_line_starts_a_line_of_its_own(monkeypatch):
    # print("loss 0.07") writes the text, then the newline: a notice came in between, and
    # "loss 0.07[ptdash] no space left ..." was one line of the script's output.
    got = _written(monkeypatch, [("script", b"step 35\nloss 0.07"), ("line", b"[ptdash] no space left\n"),
                                 ("script", b"\nstep 37\n")])
    assert got == b"step 35\nloss 0.07\n[ptdash] no space left\nstep 37\n"


def test_a_progress_bar_keeps_its_carriage_returns_around_a_ptdash_line(monkeypatch):
    got = _written(monkeypatch, [("script", b"\r 10%"), ("line", b"[ptdash] running\n"), ("script", b"\r 20%"),
                                 ("script", b"\n"), ("line", b"[ptdash] finished\n")])
    assert got == b"\r 10%\n[ptdash] running\n\r 20%\n[ptdash] finished\n"


def test_whole_lines_are_written_as_they_come(monkeypatch):
    got = _written(monkeypatch, [("script", b"a\n"), ("line", b"[ptdash] x\n"), ("script", b"\nb\n")])
    assert got == b"a\n[ptdash] x\n\nb\n"  # the script's own empty line is kept


def test_the_progress_line_has_the_newest_validation_metric_the_script_printed(tmp_path):
    run_dir = make_run(tmp_path, steps=500, status="running", now=1_700_000_000.0)
    with StoreReader(run_dir / STORE_NAME) as reader:
        assert "@" not in progress_line(reader, rundir.read_info(run_dir))  # nothing printed: nothing said
    writer = StoreWriter(run_dir / STORE_NAME)
    writer.write(rows=[[200, 0.0, {names.printed("val_loss"): 2.2921, names.printed("train_acc"): 0.5}],
                       [400, 0.0, {names.printed("test_bleu"): 14.25}], [450, 0.0, {names.printed("val_loss"): 1.5}],
                       [480, 0.0, {names.printed("train_loss"): 0.7}]])  # a training metric is not one
    writer.close()
    with StoreReader(run_dir / STORE_NAME) as reader:
        line = progress_line(reader, rundir.read_info(run_dir))
    assert "| grad norm " in line and "| val_loss 1.5 @450 | " in line and "train" not in line, line


@pytest.mark.parametrize("keeps", [False, True])
def test_an_anomaly_pause_says_how_to_roll_back_where_the_run_can(tmp_path, keeps):
    from ptdash.shared.config import RunConfig
    from ptdash.tui.watch import pause_text

    run_dir = make_run(tmp_path, steps=20, status="paused")
    info = rundir.update_info(run_dir, paused_at=20, config=RunConfig(rollback_every=10 if keeps else None))
    why = Event(kind="anomaly", step=20, wall=0.0, message="non-finite gradient before the update of step 21",
                data={"step": 21, "action": "pause", "layer": "0.weight"})
    text = pause_text(run_dir, info, why, None)
    assert (f"roll back to the last good state and go on:  ptdash ctl {run_dir} rollback" in text) is keeps
    assert "ptdash --on-anomaly rollback ..." in text
    lines = text.splitlines()
    assert lines[1] == "[ptdash]   layer: 0.weight" and lines[-1].endswith("--on-anomaly rollback ...")


def _anomaly(step: int) -> Event:
    return Event(kind="anomaly", step=step, wall=0.0, data={"step": step + 1, "action": "pause", "layer": "head.weight"},
                 message=f"non-finite gradient before the update of step {step + 1}, first in head.weight; "
                         "paused before the update")


def _answer(name: str, step: int) -> Event:
    return Event(kind="command", step=step, wall=0.0, message=f"{name}: {name}d at step {step}",
                 data={"id": f"c-{name}-{step}", "name": name, "ok": True, "applied_step": step})


def _watch(run_dir, paused_at: int, stored: list[Event]) -> list[str]:
    from ptdash.tui.watch import Watcher

    if stored:
        writer = StoreWriter(run_dir / STORE_NAME)
        writer.write(events=stored)
        writer.close()
    rundir.update_info(run_dir, status="paused", paused_at=paused_at)
    said: list[str] = []  # the pauses it says (the demo run's own events are said too)
    watcher = Watcher(run_dir, None, False, lambda line: line.startswith("[ptdash] paused") and said.append(line))
    watcher.poll(False)
    return said, watcher


def test_a_pause_waits_for_the_store_to_say_why(tmp_path):
    """run.json says paused at once; the anomaly that paused it reaches the store at the next
    flush. The pause was said "on request" in between (failed so in CI under load)."""
    run_dir = make_run(tmp_path, steps=19, status="running")
    said, watcher = _watch(run_dir, 19, [])
    assert said == []
    writer = StoreWriter(run_dir / STORE_NAME)
    writer.write(events=[_anomaly(19)])
    writer.close()
    watcher.poll(False)
    assert said[0].startswith("[ptdash] paused after step 19: non-finite gradient before the update of step 20, "
                              "first in head.weight"), said
    assert "[ptdash]   resume (the bad update is skipped):  ptdash ctl" in said[0]


def test_a_requested_pause_after_an_anomaly_pause_is_a_request(tmp_path):
    run_dir = make_run(tmp_path, steps=40, status="running")
    said, _ = _watch(run_dir, 30, [_anomaly(5), _answer("resume", 5), _answer("pause", 30)])
    assert said and said[0].startswith("[ptdash] paused after step 30: paused on request\n"), said
    assert "non-finite" not in said[0]


def test_a_pause_the_store_never_explains_is_said_after_a_while(tmp_path, monkeypatch):
    from ptdash.tui import watch

    monkeypatch.setattr(watch, "EXPLAIN_WAIT", 0.0)
    run_dir = make_run(tmp_path, steps=19, status="running")
    said, watcher = _watch(run_dir, 19, [])
    watcher.poll(False)
    assert said and said[0].startswith("[ptdash] paused after step 19: paused (the store does not say why yet)"), said


def _progress(run_dir, stored: list[Event], clock) -> tuple[list[str], object]:
    """A Watcher of a running run whose store holds ``stored``, reading time from ``clock``."""
    from ptdash.tui.watch import Watcher

    writer = StoreWriter(run_dir / STORE_NAME)
    writer.write(events=stored)
    writer.close()
    said: list[str] = []
    watcher = Watcher(run_dir, None, False, said.append, clock=clock)
    return said, watcher


def _last(line: str) -> str | None:
    return line.split("| last: ", 1)[1] if "| last: " in line else None


def test_last_names_what_asks_for_attention_for_a_minute_and_never_a_note(tmp_path):
    from ptdash.tui.watch import ATTENTION_S

    run_dir = make_run(tmp_path, steps=200, status="running", now=1_700_000_000.0)
    now = [1000.0]
    spike = Event(kind="rollback", step=151, wall=0.0, message="loss spike at step 150: rolled back to step 144",
                  data={"step": 151, "from_step": 150, "to_step": 144, "why": "loss spike", "skipped": 6})
    notes = [Event(kind="printed", step=20, wall=0.0, message="found printed metric acc = 0.54 at step 20: acc 0.54",
                   data={"name": "acc", "series": "printed/acc", "value": 0.54}),
             Event(kind="checkpoint", step=30, wall=0.0, message="saved step-30.pt", data={"path": "x"}),
             Event(kind="sampling", step=70, wall=0.0, message="sampling: per-layer norms one step in 8",
                   data={"every": 8}),
             Event(kind="finding", step=80, wall=0.0, message="cudnn-benchmark: ...",
                   data={"id": "cudnn-benchmark", "severity": "info"})]
    said, watcher = _progress(run_dir, [], lambda: now[0])
    watcher.poll(True)  # the recorded run's own anomaly, read now
    assert _last(said[-1]) == "grad norm spike 7.5 (12x median)", said[-1]
    now[0] += ATTENTION_S
    writer = StoreWriter(run_dir / STORE_NAME)
    writer.write(events=notes)
    writer.close()
    watcher.poll(True)
    assert _last(said[-1]) is None, said  # a minute on, and informational notes never reach it
    writer = StoreWriter(run_dir / STORE_NAME)
    writer.write(events=[spike, *notes[:1]])  # a note after it does not take its place
    writer.close()
    now[0] += 1
    watcher.poll(True)
    assert _last(said[-1]) == "loss spike at step 150: rolled back to step 144", said[-1]
    now[0] += ATTENTION_S - 2
    watcher.poll(True)
    assert _last(said[-1]) == "loss spike at step 150: rolled back to step 144", said[-1]
    now[0] += 2  # a minute after it was read: the line no longer repeats it
    watcher.poll(True)
    assert _last(said[-1]) is None, said[-1]
    stall = Event(kind="stall", step=190, wall=0.0, message="no rank made a step for 60 s", data={"step": 190})
    oom = Event(kind="oom", step=191, wall=0.0, message="CUDA out of memory", data={})
    writer = StoreWriter(run_dir / STORE_NAME)
    writer.write(events=[stall])
    writer.close()
    watcher.poll(True)
    assert _last(said[-1]) == "no rank made a step for 60 s", said[-1]
    writer = StoreWriter(run_dir / STORE_NAME)
    writer.write(events=[oom])  # a newer one takes the place at once
    writer.close()
    now[0] += 1
    watcher.poll(True)
    assert _last(said[-1]) == "CUDA out of memory", said[-1]


@pytest.mark.parametrize(("kind", "data", "asks"), [
    ("anomaly", {"step": 5, "action": "pause"}, True),
    ("rollback", {"step": 9, "from_step": 8, "to_step": 4, "skipped": 4}, True),
    ("rollback", {"step": 40, "lr_scale": 1.0}, False),  # the LR factor back after a rollback
    ("stall", {"step": 3, "ended": True}, False),
    ("node", {"node": 1, "lost": True}, True),
    ("node", {"node": 1}, False),
    ("warning", {"origin": "python", "text": "deprecated"}, False),  # in the script's own output already
    ("warning", {"flag": "vanishing", "layer": "fc.weight"}, True),
    ("finding", {"id": "input-bound", "severity": "warning"}, True),
    ("printed", {"name": "acc"}, False),
    ("command", {"name": "stop", "ok": True}, False),
    ("snapshot", {"bytes": 10}, False),
])
def test_what_asks_for_attention(kind, data, asks):
    from ptdash.shared import events
    from ptdash.tui.watch import asks_attention

    event = Event(kind=kind, step=1, wall=0.0, message="m", data=data)
    assert asks_attention(event, events.read(event)) is asks


def test_the_final_line_says_how_the_run_ended_once(tmp_path):
    run_dir = make_run(tmp_path, steps=300, status="finished", now=1_700_000_000.0)
    with StoreReader(run_dir / STORE_NAME) as reader:
        line = progress_line(reader, rundir.read_info(run_dir), status=False)
    assert line.startswith("[ptdash] step 300/2000 | loss ") and "finished" not in line, line


def test_no_progress_line_once_the_run_has_ended(tmp_path):
    # run.json says "finished" while the engine's process is still closing: a progress line due
    # then said "finished | step ..." before the final line said "finished (exit code 0); ...".
    run_dir = make_run(tmp_path, steps=300, status="finished", now=1_700_000_000.0)
    said, watcher = _progress(run_dir, [], lambda: 0.0)
    watcher.poll(True)
    assert not any(line.startswith("[ptdash] finished") for line in said), said


def test_a_step_without_a_norm_shows_the_newest_norm_and_its_step(tmp_path):
    run_dir = make_run(tmp_path, steps=100, status="running", now=1_700_000_000.0)
    with StoreReader(run_dir / STORE_NAME) as reader:
        norm = reader.latest()[1][names.GRAD_NORM]
        walls = reader.walls()[1]
    writer = StoreWriter(run_dir / STORE_NAME)  # steps the cost budget did not sample: a loss, no norm
    writer.write(rows=[[101 + i, walls[-1] + 0.05 * (i + 1), {names.LOSS: 0.5}] for i in range(20)])
    writer.close()
    with StoreReader(run_dir / STORE_NAME) as reader:
        line = progress_line(reader, rundir.read_info(run_dir))
    assert f"| grad norm {norm:.3g} @100 |" in line, line
