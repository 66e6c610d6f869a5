"""Only the run's owner gets in: private directory, socket and token modes, peer uid,
token, framing limits; no TCP, no abstract socket, no pickle. Real engines and sockets.

"Another user" is a real throwaway account made with useradd when the tests run as root
(skipped, with the reason, otherwise).
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from ptdash.link import socket_path
from ptdash.shared import private, protocol, rundir, transport, wire
from ptdash.shared.client import Client
from ptdash.shared.private import check_private_dir, filesystem_type, private_dir
from ptdash.shared.protocol import Command, Hello, Status, TransportError, Welcome
from ptdash.shared.transport import Server
from ptdash.shared.wire import encode
from support import users
from support.runner import ENV, SCRIPTS, Run, ptdash

STEADY = SCRIPTS / "steady.py"


# ----------------------------------------------------------------- private directory


@pytest.fixture
def runtime_dir():
    """A short XDG_RUNTIME_DIR of our own (socket paths must stay under 108 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="ptd-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_the_private_dir_is_made_0700(runtime_dir, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime_dir))
    path = private_dir()
    assert path == runtime_dir / "ptdash"
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o700 and os.lstat(path).st_uid == os.getuid()


@pytest.mark.parametrize("mode", [0o755, 0o701, 0o770, 0o707])
def test_a_private_dir_others_can_enter_is_refused(runtime_dir, monkeypatch, mode):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime_dir))
    (runtime_dir / "ptdash").mkdir()
    os.chmod(runtime_dir / "ptdash", mode)
    with pytest.raises(TransportError, match=f"mode {mode:o}; it must be 700"):
        private_dir()


def test_a_private_dir_that_is_a_symlink_is_refused(runtime_dir, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime_dir))
    target = runtime_dir / "elsewhere"
    target.mkdir(mode=0o700)
    (runtime_dir / "ptdash").symlink_to(target)
    with pytest.raises(TransportError, match="is not a directory"):
        private_dir()


def test_a_private_dir_owned_by_someone_else_is_refused(runtime_dir, monkeypatch):
    if os.getuid() != 0:
        pytest.skip("giving a directory to another user needs root")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime_dir))
    (runtime_dir / "ptdash").mkdir(mode=0o700)
    os.chown(runtime_dir / "ptdash", 65534, 65534)
    with pytest.raises(TransportError, match="belongs to uid 65534, not you"):
        private_dir()


def test_the_cli_refuses_an_unsafe_private_dir_in_one_line(runtime_dir, tmp_path):
    (runtime_dir / "ptdash").mkdir()
    os.chmod(runtime_dir / "ptdash", 0o777)
    (tmp_path / "train.py").write_text("print('trained')\n")
    result = ptdash("--headless", "train.py", cwd=tmp_path, env={**ENV, "XDG_RUNTIME_DIR": str(runtime_dir)})
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"ptdash: error: {runtime_dir / 'ptdash'} has mode 777; it must be 700"]
    assert "trained" not in result.stdout
    assert not (tmp_path / "ptdash-runs").exists()  # nothing was created


def test_network_file_systems_are_recognised():
    mounts = ("server:/export /home nfs4 rw,relatime 0 0\n"
              "//nas/share /mnt/share cifs rw 0 0\n"
              "tmpfs /run/user/1000 tmpfs rw 0 0\n"
              "/dev/sda1 / ext4 rw 0 0\n")
    assert filesystem_type(Path("/home/me/.cache"), mounts) == "nfs4"
    assert filesystem_type(Path("/mnt/share/x"), mounts) == "cifs"
    assert filesystem_type(Path("/run/user/1000/ptdash"), mounts) == "tmpfs"
    assert filesystem_type(Path("/homework"), mounts) == "ext4"  # a prefix is not a parent
    assert {"nfs", "nfs4", "cifs", "fuse.sshfs"} <= private._NETWORK_FILESYSTEMS
    check_private_dir(private_dir())  # this machine's own private dir is local


# ------------------------------------------------------------------ a real engine


@pytest.fixture
def run(tmp_path):
    r = Run(tmp_path, STEADY, "--sleep", "0.005")
    yield r
    r.close()


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def socket_inodes(pid: int) -> set[int]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def test_the_engine_listens_only_on_its_private_unix_socket(run):
    info = run.info()
    sock_path = Path(info.socket)
    assert stat.S_ISSOCK(os.lstat(sock_path).st_mode) and stat.S_IMODE(os.lstat(sock_path).st_mode) == 0o600
    assert stat.S_IMODE(os.lstat(sock_path.parent).st_mode) == 0o700
    assert stat.S_IMODE(os.lstat(run.run_dir / "token").st_mode) == 0o600
    assert len(rundir.read_token(run.run_dir)) == 64
    pid = info.pid
    inodes = socket_inodes(pid)
    assert inodes
    for table in ("tcp", "tcp6", "udp", "udp6", "raw", "raw6"):
        path = Path(f"/proc/{pid}/net/{table}")
        if path.exists():
            lines = path.read_text().splitlines()[1:]
            assert not inodes & {int(line.split()[9]) for line in lines}, f"the engine has a {table} socket"
    unix = {}
    for line in Path(f"/proc/{pid}/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[6]) in inodes:
            unix[int(fields[6])] = fields[7] if len(fields) > 7 else ""
    named = {p for p in unix.values() if p}
    # The dashboards' socket and the hub's rank socket (for ranks in other processes), both
    # 0600 in the private directory; the rest are unnamed (the server's wake-up pair).
    ranks_path = socket_path(sock_path)
    assert named == {str(sock_path), str(ranks_path)}, unix
    assert stat.S_IMODE(os.lstat(ranks_path).st_mode) == 0o600 and ranks_path.parent == sock_path.parent
    assert not any(p.startswith("@") for p in unix.values())  # no abstract socket


def test_no_pickle_on_the_wire():
    # The wire is protocol.py's messages in wire.py's JSON frames over transport.py's
    # socket: none even loads pickle (the dashboard's libraries may, for their own purposes).
    code = ("import sys, ptdash.shared.protocol, ptdash.shared.wire, ptdash.shared.transport; "
            "print('pickle' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, check=True)
    assert out.stdout.split() == ["False"]
    import ptdash.tui.source
    files = [Path(protocol.__file__), Path(wire.__file__), Path(transport.__file__),
             *Path(ptdash.tui.source.__file__).parent.glob("*.py")]
    assert len(files) > 4  # the dashboard's source package, every module of it
    for path in files:
        text = path.read_text()
        assert "import pickle" not in text and "pickle." not in text, path


def raw_connect(run) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(run.info().socket)
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (socket.timeout, ConnectionResetError):
        pass
    return data


def test_abuse_is_refused_logged_and_never_stops_training(run):
    """Oversized, malformed, unauthenticated and silent peers, one after another."""
    pid = run.info().pid
    run.wait_step(5)
    rss_before = rss_kb(pid)
    step_before = run.last_step()
    reasons = []

    # An oversized length prefix, then 32 MB the engine must never hold.
    sock = raw_connect(run)
    sock.sendall(struct.pack(">I", 0x7FFFFFFF))
    sent = 0
    try:
        for _ in range(512):
            sent += sock.send(b"\0" * 65536)
    except OSError:
        pass  # the engine closed the connection on us
    reasons.append("exceeds the limit")
    assert b"refused" in read_until_closed(sock)

    for payload, reason in ((b"\x00\x00\x00\x05hello", "not UTF-8 JSON"),
                            (struct.pack(">I", 20000) + b"[" * 20000, "nested too deeply"),
                            (encode(Command(id="x", name="stop")), "the first message must be hello"),
                            (encode(Hello(token="0" * 64)), "wrong token")):
        sock = raw_connect(run)
        sock.sendall(payload)
        assert b"refused" in read_until_closed(sock), reason
        reasons.append(reason)

    # A peer that connects and says nothing is dropped after AUTH_TIMEOUT.
    sock = raw_connect(run)
    t0 = time.monotonic()
    assert b"no hello within the time limit" in read_until_closed(sock)
    assert time.monotonic() - t0 < transport.AUTH_TIMEOUT + 3
    reasons.append("no hello within the time limit")

    log = (run.run_dir / "engine.log").read_text()
    for reason in reasons:
        assert reason in log, reason
    assert rss_kb(pid) - rss_before < 16 * 1024, "the engine buffered what it refused"
    assert run.last_step() > step_before + 5  # training went on throughout
    assert run.send("pause").ok  # and its owner still gets in
    assert run.info().status == "paused"


# -------------------------------------------------------------------- another user


@pytest.fixture(scope="module")
def intruder():
    """A throwaway account; removed afterwards."""
    reason = users.skip_reason()
    if reason:
        pytest.skip(reason)
    try:
        with users.throwaway_user() as name:
            yield name, pwd.getpwnam(name).pw_uid, users.system_python()
    except RuntimeError as exc:  # useradd refused
        pytest.skip(str(exc))


CONNECT = """
import socket, struct, sys
path, token = sys.argv[1], sys.argv[2]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(10)
try:
    s.connect(path)
except OSError as exc:
    print("CONNECT", type(exc).__name__, exc.errno)
    sys.exit(0)
hello = ('{"type":"hello","v":2,"token":"%s","client":"intruder"}' % token).encode()
try:
    s.sendall(struct.pack(">I", len(hello)) + hello)
except OSError:
    pass  # refused before our hello was read: the refusal is waiting for us anyway
data = b""
try:
    while chunk := s.recv(65536):
        data += chunk
except OSError as exc:
    data += b"(" + type(exc).__name__.encode() + b")"
print("REPLY", data[4:].decode(errors="replace"))
"""


def as_user(user: str, python: str, *args: str) -> str:
    result = subprocess.run(["runuser", "-u", user, "--", python, "-c", CONNECT, *args],
                            capture_output=True, text=True, timeout=60, cwd="/")
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_another_user_cannot_reach_a_real_engine(intruder, run):
    user, _, python = intruder
    info = run.info()
    token = rundir.read_token(run.run_dir)  # even knowing the secret does not help
    out = as_user(user, python, info.socket, token)
    assert out == f"CONNECT PermissionError {13}", out
    result = subprocess.run(["runuser", "-u", user, "--", python, "-c",
                             f"open({str(run.run_dir / 'token')!r}).read()"], capture_output=True, text=True)
    assert result.returncode != 0 and "PermissionError" in result.stderr
    before = run.last_step()
    run.wait_step(before + 3)


def test_a_peer_of_another_uid_is_refused_before_anything_is_read(intruder):
    """With the directory opened up on purpose, SO_PEERCRED still keeps others out."""
    user, uid, python = intruder
    base = Path(tempfile.mkdtemp(prefix="ptd-"))
    private = base / "p"
    private.mkdir(mode=0o700)
    heard = []
    server = Server(private / "s.sock", "k" * 64, Welcome(run_id="r", run_dir=str(base), pid=os.getpid()),
                    on_command=heard.append, on_connect=lambda: [Status(state="running", step=1)])
    server.start()
    try:
        os.chmod(base, 0o755)
        os.chmod(private, 0o755)
        os.chmod(private / "s.sock", 0o666)
        out = as_user(user, python, str(private / "s.sock"), "k" * 64)
        assert out.startswith("REPLY ") and "only the run's owner may connect" in out, out
        assert f"refused a connection from uid {uid}" in " ".join(server.refusals)
        assert heard == []
        # The owner is still served.
        client = Client(private / "s.sock", "k" * 64)
        assert isinstance(client.connect(), Welcome)
        client.close()
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)
