"""``--notify CMD`` through the real CLI: a command that appends what it receives, on an
unmodified script with wild batches under ``--on-anomaly rollback``.

The notifier is a process of its own that outlives ``ptdash`` by a moment (it tells the end
once run.json has it), so the tests wait for what it wrote, and for it to be gone."""

from __future__ import annotations

import json
from pathlib import Path

from ptdash.shared.reader import StoreReader
from support.runner import SCRIPTS, ptdash, wait_for

WILD = SCRIPTS / "wild_batch.py"
RECORD = '{ printf "%s\\t%s\\t%s\\t" "$(date +%s.%N)" "$PTDASH_EVENT" "$PTDASH_RUN"; cat; } >> calls.tsv'
"""The user's command: when it was called, its environment's two names, then the JSON it read."""


def _calls(path: Path) -> list[tuple[float, str, str, dict]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        wall, event, run, body = line.split("\t", 3)
        out.append((float(wall), event, run, json.loads(body)))
    return out


def _notifier_gone(run_dir: Path) -> bool:
    """No notifier process follows ``run_dir`` any more."""
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"ptdash.tui.notify" in cmdline and str(run_dir).encode() in cmdline:
            return False
    return True


def _events(run_dir: Path, kind: str):
    with StoreReader(run_dir / "metrics.db") as store:
        return [e for e in store.events() if e.kind == kind]


def test_the_rollbacks_and_the_end_reach_the_command_at_one_call_a_kind_a_minute(tmp_path):
    result = ptdash("--headless", "--run-dir", "run", "--on-anomaly", "rollback", "--rollback-every", "5",
                    "--notify", RECORD, str(WILD), "--bad", "wild", "--at", "40", "60", "80", "--steps", "120",
                    cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:]
    run_dir = (tmp_path / "run").resolve()
    calls = wait_for(lambda: [c for c in _calls(tmp_path / "calls.tsv") if c[1] == "end"] and
                     _notifier_gone(run_dir) and _calls(tmp_path / "calls.tsv"), 60, what="the end's call")
    for _, event, run, body in calls:
        assert event == body["event"] and run == str(run_dir) and body["run_dir"] == str(run_dir)
        assert body["run"] == "run"
    *rest, (_, _, _, end) = calls
    assert end["state"] == "finished" and end["exit_code"] == 0 and end["step"] == 120, end
    assert {c[1] for c in rest} == {"rollback"}, calls
    rollbacks = [e for e in _events(run_dir, "rollback") if e.data.get("to_step") is not None]
    assert len(rollbacks) == 3, rollbacks
    # Every rollback is told, in a call of its own or summed in a later one (or in the end's):
    told = sum(body["count"] for *_, body in rest) + end.get("held", {}).get("rollback", {}).get("count", 0)
    assert told == len(rollbacks)
    first = rest[0][3]
    assert first["count"] == 1 and first["message"] == rollbacks[0].message
    assert (first["from_step"], first["to_step"]) == (rollbacks[0].data["from_step"], rollbacks[0].data["to_step"])
    # The burst (three rollbacks in 40 steps) is held to the rate: fewer calls than rollbacks,
    # and never two calls of the kind within a minute by the command's own clock.
    assert len(rest) < len(rollbacks)
    walls = [c[0] for c in rest]
    assert all(b - a >= 60 for a, b in zip(walls, walls[1:])), walls


def test_a_failing_command_is_journaled_once(tmp_path):
    failing = 'echo "$PTDASH_EVENT" >> tries; echo "curl: (7) no route to host" >&2; exit 7'
    result = ptdash("--headless", "--run-dir", "run", "--on-anomaly", "rollback", "--notify", failing,
                    str(WILD), "--bad", "wild", "--at", "40", "--steps", "100", cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:]
    run_dir = (tmp_path / "run").resolve()
    wait_for(lambda: _notifier_gone(run_dir), 60, what="the notifier to end")
    assert (tmp_path / "tries").read_text().split() == ["rollback", "end"]
    (warning,) = [e for e in _events(run_dir, "warning") if "notify" in e.data]
    assert "exited with 7" in warning.message and "no route to host" in warning.message, warning.message
    assert "rollback" in warning.message


def test_a_bad_notify_on_is_refused_in_one_line(tmp_path):
    result = ptdash("--notify", "true", "--notify-on", "end,crash", str(WILD), cwd=tmp_path)
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()[-1:]
    assert "--notify-on" in line and "crash" in line, result.stderr
    assert not (tmp_path / "ptdash-runs").exists()


def test_a_detached_run_killed_with_nobody_watching_is_told_killed(tmp_path):
    """The front detaches (SIGHUP: the terminal went away), then the engine is SIGKILLed: no
    front writes its end and the engine cannot, yet the notifier tells a ``killed`` end."""
    import os
    import signal

    from ptdash.shared import rundir
    from support.runner import Run

    run = Run(tmp_path, SCRIPTS / "steady.py", "--sleep", "0.05", options=("--notify", RECORD))
    try:
        run.wait_step(3)
        run.proc.send_signal(signal.SIGHUP)
        assert run.proc.wait(60) != 0  # it detached: training goes on by itself
        run.wait_step(run.last_step() + 3)
        os.kill(rundir.read_info(run.run_dir).pid, signal.SIGKILL)
        run_dir = run.run_dir.resolve()
        calls = wait_for(lambda: _notifier_gone(run_dir) and _calls(tmp_path / "calls.tsv"), 90,
                         what="the notifier's end call")
    finally:
        run.close()
    (*_, (_, event, where, end),) = calls
    assert event == "end" and where == str(run_dir) and end["state"] == "killed", calls
    assert "went away" in end["message"] and end["exit_code"] is None
