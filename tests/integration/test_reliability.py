"""Training outlives the terminal, and a stalled terminal never slows it.

Real engines, a real `ptdash` in tmux, real signals. The soak tests hold a stalled
reader for PTDASH_SOAK_SECONDS (default 20; run once with 60 for the issue's figures,
with -s to see them) and compare training step time with a baseline without any
dashboard, watch the engine's memory, check the store lost nothing, and re-attach.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from ptdash.shared import rundir
from ptdash.shared.client import Client
from ptdash.shared.protocol import Hello
from ptdash.shared.reader import StoreReader
from ptdash.shared.store import STORE_NAME
from ptdash.shared.wire import encode
from support.runner import ENV, SCRIPTS, Run, engine_pid, ptdash, wait_for
from support.tmux import Terminal, require_tmux

STEADY = SCRIPTS / "steady.py"
PTDASH = f"{sys.executable} -m ptdash.tui.cli"
SOAK_S = float(os.environ.get("PTDASH_SOAK_SECONDS", "20"))
BASELINE_S = max(10.0, SOAK_S / 2)


@pytest.fixture(scope="module")
def runtime_dir():
    """A private XDG_RUNTIME_DIR: its own live-run registry, so `attach` finds only our runs."""
    path = Path(tempfile.mkdtemp(prefix="ptd-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def term_env(runtime_dir: Path) -> dict:
    return {"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "TERM": "xterm-256color",
            "XDG_RUNTIME_DIR": str(runtime_dir)}


@pytest.fixture
def term(request):
    require_tmux()
    t = Terminal(request.node.name[:16])
    yield t
    t.close()


# ------------------------------------------------------------------- processes


def children(pid: int) -> list[int]:
    out = []
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat_file.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat_file.parent.name))
    return out


def pane_process(term: Terminal, session: str) -> tuple[int, int]:
    """(pid of the command running in the pane, its process group)."""
    shell = int(term.tmux("list-panes", "-t", session, "-F", "#{pane_pid}").split()[0])
    pid = wait_for(lambda: next(iter(children(shell)), None), 10, what="the pane's command")
    return pid, os.getpgid(pid)


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def last_step(run_dir: Path) -> int:
    try:
        with StoreReader(run_dir / STORE_NAME) as s:
            return s.last_step() or 0
    except Exception:
        return 0


def kill_engine(run_dir: Path) -> None:
    pid = engine_pid(run_dir)
    if pid:
        os.kill(pid, signal.SIGKILL)


def header_step(screen: str) -> int:
    match = re.search(r"step ([\d,]+)", screen)
    assert match, screen
    return int(match.group(1).replace(",", ""))


# ---------------------------------------------------------- outliving the terminal


def test_sighup_to_the_dashboard_keeps_training_and_attach_finds_the_run(term, tmp_path, runtime_dir):
    run_dir = tmp_path / "run"
    env = term_env(runtime_dir)
    term.start("main", f"{PTDASH} --run-dir {run_dir} {STEADY} --sleep 0.02", tmp_path, env=env)
    try:
        term.wait_for("main", "running", 90)
        wait_for(lambda: last_step(run_dir) >= 5, 60, what="steps")
        dash, group = pane_process(term, "main")
        engine = rundir.read_info(run_dir).pid
        assert os.getpgid(engine) != group  # the engine is in a session of its own
        os.killpg(group, signal.SIGHUP)  # the terminal hangs up on the dashboard's process group
        wait_for(lambda: gone(dash), 10, what="the dashboard to die of SIGHUP")
        at_hup = last_step(run_dir)
        wait_for(lambda: last_step(run_dir) > at_hup + 20, 30, what="training to go on without a terminal")
        assert rundir.read_info(run_dir).status == "running" and not gone(engine)

        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        listed = ptdash("ls", cwd=elsewhere, env={**ENV, "XDG_RUNTIME_DIR": str(runtime_dir)})
        line = next(x for x in listed.stdout.splitlines() if run_dir.name in x)
        assert line.split()[1] == "live" and str(run_dir) in line  # found through the registry

        # `ptdash attach` with no argument, from another directory: the newest live run.
        term.start("back", f"{PTDASH} attach", elsewhere, env=env)
        screen = term.wait_for("back", "running", 60)
        assert "loss" in screen
        wait_for(lambda: header_step(term.screen("back")) > at_hup + 20, 30, what="the header to follow live")
        stopped = ptdash("ctl", str(run_dir), "stop", cwd=elsewhere, env={**ENV, "XDG_RUNTIME_DIR": str(runtime_dir)})
        assert stopped.returncode == 0, stopped.stderr
        term.wait_for("back", "stopped", 60)
    finally:
        kill_engine(run_dir)


def test_ls_names_every_state_and_attach_never_guesses_between_live_runs(tmp_path, runtime_dir, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime_dir))
    monkeypatch.chdir(tmp_path)
    env = {**ENV, "XDG_RUNTIME_DIR": str(runtime_dir)}
    root = tmp_path / rundir.DEFAULT_ROOT
    # A process that is an engine by its command line, one that is not, and a dead pid.
    engine_like = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "ptdash.bootstrap"])
    other = subprocess.Popen(["sleep", "120"])
    dead = subprocess.Popen(["true"])
    dead.wait()
    try:
        cases = {
            "a-live": dict(status="running", pid=engine_like.pid),
            "b-paused": dict(status="paused", pid=engine_like.pid),
            "c-finished": dict(status="finished", pid=dead.pid, exit_code=0, step=1200),
            "d-crashed": dict(status="crashed", pid=dead.pid, exit_code=1, step=7),
            "e-stopped": dict(status="stopped", pid=dead.pid, exit_code=0, step=30),
            "f-lost": dict(status="running", pid=dead.pid, step=40),
            "g-reused": dict(status="running", pid=other.pid, step=41),  # a pid now used by another program
        }
        for i, (name, changes) in enumerate(cases.items()):
            d = rundir.create(root, name, exact=True)
            rundir.update_info(d, started=time.time() - 3600 * (10 - i), **changes)
        listed = ptdash("ls", cwd=tmp_path, env=env)
        assert listed.returncode == 0, listed.stderr
        states = {line.split()[0]: line.split()[1] for line in listed.stdout.splitlines()[1:]}
        assert states == {"a-live": "live", "b-paused": "paused", "c-finished": "finished", "d-crashed": "crashed",
                          "e-stopped": "stopped", "f-lost": "lost", "g-reused": "lost"}, listed.stdout
        line = next(x for x in listed.stdout.splitlines() if x.startswith("c-finished"))
        assert "1,200" in line and " 8h " in line and str((root / "c-finished").resolve()) in line

        from ptdash.tui import runs
        with pytest.raises(runs.Ambiguous) as caught:  # two live runs here: no guess
            runs.resolve(None, live_only=True)
        assert [r.path.name for r in caught.value.candidates] == ["a-live", "b-paused"]
        assert caught.value.code == 2
        assert runs.resolve(None).path.name == "g-reused"  # the newest, for reading (doctor)
        assert runs.resolve("c-fin").path.name == "c-finished"
        missing = ptdash("attach", "no-such-run", cwd=tmp_path, env=env)
        assert missing.returncode == 1 and "no run matching 'no-such-run'" in missing.stderr
    finally:
        engine_like.kill()
        other.kill()
        engine_like.wait()
        other.wait()
    nothing = ptdash("attach", cwd=tmp_path, env=env)
    assert nothing.returncode == 1 and nothing.stderr.strip() == "ptdash: error: no live run (see `ptdash ls`)"


def test_show_opens_a_finished_run_read_only(term, tmp_path, runtime_dir, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime_dir))
    from support.recorded_run import make_run

    run_dir = make_run(tmp_path / rundir.DEFAULT_ROOT, steps=800, status="finished", exit_code=0)
    term.start("show", f"{PTDASH} show {run_dir.name[:18]}", tmp_path, env=term_env(runtime_dir))
    screen = term.wait_for("show", "finished", 30)
    term.wait_for("show", "read-only", 10)
    assert "step 800" in screen
    term.keys("show", "Space")  # nothing to pause: the keys that steer a run are not there
    time.sleep(0.5)
    assert "Pause" not in term.screen("show") and "pausing" not in term.screen("show")
    term.keys("show", "q")
    term.wait_for("show", "EXITED 0", 10)


# --------------------------------------------------------------------- soak tests


def window(run_dir: Path, engine: int, seconds: float) -> dict:
    """Step time and rate of the training script over the next ``seconds``, and engine memory."""
    t0 = time.time()
    rss = [rss_mb(engine)]
    while time.time() - t0 < seconds:
        time.sleep(1.0)
        rss.append(rss_mb(engine))
    t1 = time.time()
    time.sleep(1.0)  # the flusher stores the window's last steps
    with StoreReader(run_dir / STORE_NAME) as s:
        steps, walls = s.walls()
        inside = [st for st, w in zip(steps, walls) if t0 <= w <= t1]
        by_step = dict(zip(*s.series("time/step_s", after_step=inside[0] - 1 if inside else None)))
    times = sorted(by_step[st] for st in inside if by_step.get(st) is not None)
    return {"steps": len(inside), "steps_per_s": len(inside) / (t1 - t0),
            "median_ms": 1e3 * statistics.median(times), "p90_ms": 1e3 * times[len(times) * 9 // 10],
            "rss_start_mb": rss[0], "rss_end_mb": rss[-1], "rss_max_mb": max(rss)}


def describe(name: str, w: dict) -> str:
    return (f"{name}: {w['steps']} steps, {w['steps_per_s']:.1f} steps/s, step time median {w['median_ms']:.2f} ms "
            f"p90 {w['p90_ms']:.2f} ms, engine RSS {w['rss_start_mb']:.1f} -> {w['rss_end_mb']:.1f} MB "
            f"(max {w['rss_max_mb']:.1f})")


@pytest.fixture(scope="module")
def soak(tmp_path_factory):
    """One steady run shared by the soak tests, with its no-dashboard baseline."""
    tmp = tmp_path_factory.mktemp("soak")
    # Every statistic on every step (no cost budget): the store must have each step's norm.
    run = Run(tmp, STEADY, "--sleep", "0.01", options=("--overhead-budget", "100"))
    run.client.close()  # a test client that never reads would be a stalled reader itself
    try:
        run.wait_step(30)
        engine = run.info().pid
        baseline = window(run.run_dir, engine, BASELINE_S)
        print("\n" + describe(f"baseline, no dashboard ({BASELINE_S:.0f} s)", baseline))
        yield run, engine, baseline
    finally:
        run.close()


def assert_barely_changed(stalled: dict, baseline: dict) -> None:
    assert stalled["median_ms"] < 1.25 * baseline["median_ms"] + 2.0, (stalled, baseline)
    assert stalled["steps_per_s"] > 0.75 * baseline["steps_per_s"], (stalled, baseline)
    # Bounded: what a stalled reader may cost is capped by transport.METRICS_BUFFER (4 MB)
    # for live samples, and by HARD_BUFFER (32 MB) before the reader is cut off.
    assert stalled["rss_max_mb"] - stalled["rss_start_mb"] < 40, stalled


def assert_store_complete(run_dir: Path) -> int:
    with StoreReader(run_dir / STORE_NAME) as s:
        steps, _ = s.walls()
        loss, _ = s.series("loss")
        norms, _ = s.series("grad/norm_total")
    assert steps == list(range(1, len(steps) + 1)), "a step is missing from the store"
    # Each read is its own snapshot of a store still being written: compare what all saw.
    assert loss[:len(steps)] == steps and norms[:len(steps)] == steps
    assert loss == list(range(1, len(loss) + 1)) and norms == list(range(1, len(norms) + 1))
    return steps[-1]


def test_a_client_that_connects_and_never_reads_does_not_slow_training(soak):
    run, engine, baseline = soak
    info = run.info()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(info.socket)
    sock.sendall(encode(Hello(token=rundir.read_token(run.run_dir), client="never-reads")))
    try:
        stalled = window(run.run_dir, engine, SOAK_S)
    finally:
        sock.close()
    print(describe(f"a client that never reads ({SOAK_S:.0f} s)", stalled))
    assert_barely_changed(stalled, baseline)
    assert_store_complete(run.run_dir)
    # The engine still serves its owner, and `ls` follows the state.
    client = Client(info.socket, rundir.read_token(run.run_dir), name="test")
    client.connect()
    run.client = client
    assert run.send("pause").ok
    listed = ptdash("ls", cwd=run.run_dir.parent)
    assert next(x for x in listed.stdout.splitlines() if x.endswith(str(run.run_dir))).split()[1] == "paused"
    assert run.send("resume").ok
    client.close()


def test_a_stopped_dashboard_then_killed_costs_training_nothing(soak, term):
    run, engine, baseline = soak
    term.start("dash", f"{PTDASH} attach {run.run_dir}", run.run_dir.parent, width=120, height=36,
               env={"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "TERM": "xterm-256color"})
    screen = term.wait_for("dash", "running", 60)
    assert "loss" in screen
    dash, group = pane_process(term, "dash")
    os.killpg(group, signal.SIGSTOP)
    try:
        stalled = window(run.run_dir, engine, SOAK_S)
    finally:
        os.killpg(group, signal.SIGKILL)
    wait_for(lambda: gone(dash), 10, what="the stopped dashboard to die")
    print(describe(f"dashboard stopped with SIGSTOP ({SOAK_S:.0f} s), then killed", stalled))
    assert_barely_changed(stalled, baseline)
    at_kill = assert_store_complete(run.run_dir)
    # This machine's load drifts: a second baseline brackets the stalled windows.
    print(describe(f"baseline again, no dashboard ({BASELINE_S:.0f} s)", window(run.run_dir, engine, BASELINE_S)))

    # A new `ptdash attach` loads the whole history and follows live.
    term.start("again", f"{PTDASH} attach {run.run_dir}", run.run_dir.parent, width=120, height=36,
               env={"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "TERM": "xterm-256color"})
    term.wait_for("again", "running", 60)
    wait_for(lambda: header_step(term.screen("again")) > at_kill, 30, what="the new dashboard to catch up")
    from ptdash.tui.source import History
    from ptdash.tui.source.live import LiveSource
    got = []
    source = LiveSource(run.run_dir)
    source.start(got.append)
    try:
        history = wait_for(lambda: next((x for x in got if isinstance(x, History)), None), 30, what="history")
        steps, _ = history.series["loss"]
        assert steps[0] == 1 and steps[-1] >= at_kill and len(steps) <= 4000
        wait_for(lambda: source.can_control, 30, what="the live connection")
    finally:
        source.close()
    assert_store_complete(run.run_dir)
