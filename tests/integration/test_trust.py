"""Trust on the run's own machine (issue 41): a runtime directory another user could rename
things in is passed over, the token goes only to an engine of this user, dashboards that
stopped reading never lock ``ptdash ctl`` out, and a NaN from a program using the Python
client is refused there, never sent as null ("no override"). Real runs through the real
CLI, real sockets, real other uids (root only, as in CI; skipped with the reason otherwise).
"""

from __future__ import annotations

import math
import os
import shutil
import socket
import stat
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

from ptdash.shared import rundir, seats, wire
from ptdash.shared.client import Client
from ptdash.shared.protocol import Ack, Command, Hello, ProtocolError, Refused, Welcome
from support import users
from support.runner import ENV, SCRIPTS, Run, ptdash, wait_for

STEADY = SCRIPTS / "steady.py"
STRANGER = 54321
"""A uid nobody on the machine has: the owner of a "foreign" directory."""
needs_root = pytest.mark.skipif(os.getuid() != 0, reason="giving a directory or a socket to another uid needs root")


@pytest.fixture
def runtime():
    """A short directory for XDG_RUNTIME_DIR (socket paths must stay under 108 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="ptd-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _headless(tmp_path: Path, runtime: Path) -> tuple[subprocess.CompletedProcess, rundir.RunInfo]:
    (tmp_path / "train.py").write_text("print('trained')\n")
    result = ptdash("--headless", "--run-dir", str(tmp_path / "run"), "train.py", cwd=tmp_path,
                    env={**ENV, "XDG_RUNTIME_DIR": str(runtime)})
    return result, rundir.read_info(tmp_path / "run")


@pytest.mark.parametrize("kind", ["another user's", "writable by all, no sticky bit"])
def test_an_xdg_runtime_dir_others_could_rename_in_is_not_used_and_the_run_says_so(tmp_path, runtime, kind):
    if kind == "another user's":
        if os.getuid() != 0:
            pytest.skip("giving a directory to another uid needs root")
        os.chown(runtime, STRANGER, STRANGER)  # 0700, ours to write in only as root: root's run used it
        why = f"{runtime} belongs to uid {STRANGER}, not you"
    else:
        os.chmod(runtime, 0o777)
        why = f"others may write to {runtime} (mode 777, no sticky bit)"
    result, info = _headless(tmp_path, runtime)
    assert result.returncode == 0, result.stderr
    fallback = Path(tempfile.gettempdir()) / f"ptdash-{os.getuid()}"
    assert f"ptdash: XDG_RUNTIME_DIR {runtime} is not used: {why}; the control socket goes in {fallback} instead" \
        in result.stderr.splitlines(), result.stderr
    assert list(runtime.iterdir()) == []  # nothing of the run's in it: no ptdash/, no socket, no registry
    assert Path(info.socket).parent == fallback and info.status == "finished", info
    assert "trained" in (tmp_path / "run" / "output.log").read_text()


def test_a_sticky_xdg_runtime_dir_of_ones_own_is_used(tmp_path, runtime):
    os.chmod(runtime, 0o1777)  # as /tmp: others may add entries, never rename ours
    result, info = _headless(tmp_path, runtime)
    assert result.returncode == 0 and "is not used" not in result.stderr, result.stderr
    assert Path(info.socket).parent == runtime / "ptdash"


LISTENER = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1]); s.listen(4)
print("listening", flush=True)
conn, _ = s.accept()
conn.settimeout(10)
got = b""
try:
    while chunk := conn.recv(4096):
        got += chunk
except OSError:
    pass
print(len(got), flush=True)
"""


@needs_root
def test_ctl_sends_no_token_to_a_socket_another_user_put_at_the_runs_path(tmp_path):
    """The attack a foreign runtime dir allows: another user's process listens at the run's
    socket path. ``ptdash ctl`` checks who listens (SO_PEERCRED) and sends nothing."""
    run = Run(tmp_path, STEADY, "--sleep", "0.01")
    theirs = Path(tempfile.mkdtemp(prefix="ptd-x-"))
    intruder = None
    try:
        run.wait_step(3)
        os.chown(theirs, 65534, 65534)
        intruder = subprocess.Popen([users.system_python() or "/usr/bin/python3", "-I", "-c", LISTENER,
                                     str(theirs / "s")], user=65534, group=65534, extra_groups=[],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/")
        assert intruder.stdout.readline().strip() == "listening", intruder.stderr.read()
        ours = Path(run.info().socket)
        os.rename(ours, ours.with_name("aside.sock"))
        os.rename(theirs / "s", ours)  # what a user who may rename in the runtime dir can do
        result = ptdash("ctl", str(run.run_dir), "stop", cwd=tmp_path)
        assert result.returncode == 1, (result.stdout, result.stderr)
        assert result.stderr.strip() == (f"ptdash: error: the socket {ours} is served by uid 65534, not by you "
                                         f"(uid {os.getuid()}): not an engine of yours; the run's token was not sent")
        out, err = intruder.communicate(timeout=60)
        assert out.strip() == "0", (out, err)  # it got a connection and not one byte: no hello, no token
        os.replace(ours.with_name("aside.sock"), ours)
        stepped = run.last_step()
        run.wait_step(stepped + 5)  # the run never heard of the stop
    finally:
        if intruder is not None and intruder.poll() is None:
            intruder.kill()
            intruder.wait()
        shutil.rmtree(theirs, ignore_errors=True)
        run.close()


def _frozen(path: str, token: str, count: int) -> tuple[list[socket.socket], int]:
    """``count`` dashboards that say hello, read their first answer, and never read again."""
    socks, welcomed = [], 0
    for n in range(count):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
        sock.sendall(wire.encode(Hello(token=token, client="dashboard")))
        reader = wire.FrameReader()
        sock.settimeout(30)
        first = None
        while first is None:
            data = sock.recv(4096)
            if not data:
                break
            frames = reader.feed(data)
            first = wire.decode(frames[0]) if frames else None
        welcomed += isinstance(first, Welcome)
        assert isinstance(first, (Welcome, Refused)), first
        socks.append(sock)
    return socks, welcomed


def test_forty_frozen_dashboards_never_lock_ctl_out_and_are_dropped_and_journaled(tmp_path):
    run = Run(tmp_path, STEADY, "--sleep", "0.002")
    run.client.close()  # the test's own client would freeze too: only the forty and ctl here
    frozen = []
    try:
        run.wait_step(3)
        info = run.info()
        frozen, welcomed = _frozen(info.socket, rundir.read_token(run.run_dir), 40)
        assert welcomed == 32, welcomed  # every dashboard seat is taken
        result = ptdash("ctl", str(run.run_dir), "clip", "7", cwd=tmp_path)
        assert result.returncode == 0 and ": clip: at step " in result.stdout, (result.stdout, result.stderr)
        wait_for(lambda: run.info().clip == 7.0, 60, what="run.json to say the clip")
        # Their sockets fill (nothing they are sent is read); after STALL_SECONDS they are dropped.
        dropped = wait_for(lambda: [e for e in _events(run) if "disconnected: it read nothing" in e.message
                                    and e.kind == "warning"], 300, interval=1, what="the frozen dashboards dropped")
        assert dropped[0].message.startswith(f"client dashboard disconnected: it read nothing for "
                                             f"{seats.STALL_SECONDS:g} s"), dropped[0].message
        drops = wait_for(lambda: sum("disconnected: it read nothing" in e.message for e in _events(run)) >= 32 or None,
                         300, interval=1, what="all 32 dropped")
        assert drops
        client = Client(info.socket, rundir.read_token(run.run_dir))  # a dashboard's seat is free again
        assert isinstance(client.connect(), Welcome)
        client.close()
    finally:
        for sock in frozen:
            sock.close()
        run.close()


def _events(run: Run) -> list:
    with run.store() as s:
        return s.events()


def _acks_until(client: Client, last: str) -> list[Ack]:
    acks = []
    while not acks or acks[-1].id != last:
        msg = client.recv(timeout=60)
        assert msg is not None, "no answer from the engine"
        if isinstance(msg, Ack):
            acks.append(msg)
    return acks


def test_a_nan_from_a_program_using_the_python_client_is_refused_there_and_clipping_stays(tmp_path):
    run = Run(tmp_path, STEADY, "--sleep", "0.01")
    try:
        assert run.send("clip", 0.5).ok
        for bad in (math.nan, math.inf, -math.inf):
            with pytest.raises(ProtocolError) as refused:
                run.client.send(Command(id=uuid.uuid4().hex[:8], name="clip", value=bad))
            assert str(refused.value) == (f"clip value {bad!r} is not a finite number: not sent "
                                          "(a command's null would mean no override)")
        check = Command(id=uuid.uuid4().hex[:8], name="lr_scale", value=1.0)
        run.client.send(check)
        acks = _acks_until(run.client, check.id)
        assert [a.id for a in acks] == [check.id]  # nothing else reached the engine
        assert run.info().clip == 0.5
        step = acks[-1].step
        run.wait_step(step + 5)
        steps, values = run.series("grad/clip_max")
        assert [v for s, v in zip(steps, values) if s > step] and \
            all(v == 0.5 for s, v in zip(steps, values) if s > step)  # still clipped at 0.5
    finally:
        run.close()
