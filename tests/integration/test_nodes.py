"""Two nodes on one machine, each with its own ``ptdash`` launcher, as ``torchrun --nnodes 2``
runs them: node 1 in mount and UTS namespaces of its own (another host name; node 0's run
dir and private directory hidden under empty file systems), so the only way between them
is the hub's authenticated TCP port. Node 1's rank is in node 0's store; pause, clip, LR and
stop reach both nodes at one step and the replicas stay identical; peers without the key,
of another job, another local user and garbage are refused while training goes on; a
killed node is named with its rank and the run ends as torchrun ends it."""

from __future__ import annotations

import os
import random
import shlex
import signal
import socket
import subprocess
import sys

import pytest
import torch

from ptdash import link
from ptdash.shared import authlink, events, rundir
from ptdash.shared.client import Client
from ptdash.shared.reader import StoreReader
from support import users
from support.runner import ENV, SCRIPTS, Run, kill_all, processes_in, wait_for

pytestmark = pytest.mark.slow

NODE1 = "ptdash-node1"
DDP = SCRIPTS / "ddp_train.py"


def _unshare_reason() -> str | None:
    """Why node 1 cannot have namespaces of its own here, or None."""
    try:
        probe = subprocess.run(["unshare", "--mount", "--uts", "true"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare cannot run: {exc}"
    return None if probe.returncode == 0 else f"unshare --mount --uts fails: {probe.stderr.strip()}"


UNSHARE = _unshare_reason()
if UNSHARE and os.environ.get("CI"):
    raise RuntimeError(f"CI runs as root and must run the two-node tests: {UNSHARE}")
needs_unshare = pytest.mark.skipif(UNSHARE is not None, reason=f"two simulated nodes need namespaces: {UNSHARE}")


def _ports() -> int:
    """A port P with P and P + 1 free (the rendezvous and the hub's port)."""
    for _ in range(200):
        port = random.randrange(20000, 60000)
        socks = []
        try:
            for p in (port, port + 1):
                s = socket.socket()
                s.bind(("127.0.0.1", p))
                socks.append(s)
            return port
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no two free ports in a row")


def _node1(argv: list[str], cwd, env: dict, out, hidden, absent=None) -> subprocess.Popen:
    """``argv`` as node 1: empty file systems over ``hidden`` (node 0's dirs), a host name of
    its own; the shell proves node 0's files are out of sight (``absent``) before it starts."""
    mounts = "; ".join(f"mount -t tmpfs -o mode=700 none {shlex.quote(str(d))} || exit 96" for d in hidden)
    check = f"test ! -e {shlex.quote(str(absent))} || exit 97; " if absent else ""
    shell = f"{mounts}; hostname {NODE1} || exit 96; {check}exec {shlex.join(argv)}"
    return subprocess.Popen(["unshare", "--mount", "--uts", "--propagation", "private", "sh", "-c", shell],
                            cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


class TwoNodes(Run):
    """Node 0 (the hub, with the run dir) and node 1 (hidden from it), both headless."""

    def __init__(self, tmp_path, *args: str) -> None:
        self.tmp = tmp_path
        self.n0, self.n1, home, runtime = (tmp_path / n for n in ("n0", "n1", "home", "rt0"))
        for d in (self.n0, self.n1, home, runtime):
            d.mkdir(mode=0o700)
        self.run_dir = self.n0 / "run"
        self.port = _ports()
        env = {**ENV, "XDG_CONFIG_HOME": str(home), "XDG_RUNTIME_DIR": str(runtime)}
        self.env = env
        common = ["--headless", "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-endpoint",
                  f"127.0.0.1:{self.port}", "--rdzv-id", "job-31"]
        cli = [sys.executable, "-m", "ptdash.tui.cli"]
        self.out = open(tmp_path / "node0.out", "w")
        self.proc = subprocess.Popen([*cli, *common, "--node-rank", "0", "--run-dir", str(self.run_dir), str(DDP),
                                      *args], cwd=self.n0, env=env, stdout=self.out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        wait_for(lambda: (self.run_dir / "run.json").exists(), 60, what="node 0's run dir")
        self.out1 = open(tmp_path / "node1.out", "w")
        self.node1 = _node1([*cli, *common, "--node-rank", "1", str(DDP), *args], self.n1, env, self.out1,
                            hidden=(self.n0, runtime), absent=self.run_dir / "run.json")
        wait_for(lambda: self.info().status == "running" or self.proc.poll() is not None
                 or self.node1.poll() is not None, 120, what="the job to start")
        assert self.node1.poll() is None, (tmp_path / "node1.out").read_text()
        self.client = Client(self.info().socket, rundir.read_token(self.run_dir), name="test")
        self.client.connect()

    def stepping(self, n: int) -> None:
        wait_for(lambda: self.last_step(0) >= n and self.last_step(1) >= n, 120, what=f"both nodes past step {n}")

    def close(self) -> None:
        super().close()
        if self.node1.poll() is None:
            self.node1.kill()
        self.node1.wait()
        self.out1.close()
        kill_all(processes_in(self.n0) + processes_in(self.n1))


@pytest.fixture
def nodes(tmp_path):
    made = []

    def start(*args):
        made.append(TwoNodes(tmp_path, *args))
        return made[-1]
    yield start
    for n in made:
        n.close()


def _events(run) -> list:
    with run.store() as s:
        return s.events()


def _intruders(run: TwoNodes) -> list[str]:
    """Knock on the hub's port as nobody should get in; what each was told."""
    host, port = "127.0.0.1", run.port + 1
    told = []
    with pytest.raises(authlink.LinkRefused):  # no key: refused in the handshake
        authlink.dial(host, port, os.urandom(32))
    for garbage in (b"GET / HTTP/1.1\r\n\r\n", os.urandom(4096), b"PTDLNK01" + b"\0" * 64):
        with socket.create_connection((host, port)) as s:
            s.sendall(garbage)
            s.settimeout(30)
            try:
                while s.recv(4096):
                    pass
            except OSError:
                pass
    key = bytes.fromhex((run.tmp / "home" / "ptdash" / "link.key").read_text())  # the job's own key
    for hello in ({"job": "another-job", "node": 1, "host": "x", "config": {}},  # the key, another job
                  {"job": "job-31", "node": 0, "host": "x", "config": {}},  # claims to be the hub's node
                  {"job": "job-31", "node": 1, "host": "x", "config": {"clip": 9.0}}):  # other options
        with pytest.raises(link.LinkError) as refused:
            link.connect((host, port, key), "", 1, 2, "control", timeout=10, extra=hello)
        told.append(str(refused.value))
    return told


@needs_unshare
def test_two_nodes_are_one_run_steered_at_one_step_and_only_the_job_gets_in(nodes):
    run = nodes("--sleep", "0.02")
    run.stepping(3)
    told = _intruders(run)
    assert "another-job" in told[0] and "not another node" in told[1] and "clip" in told[2], told
    if users.skip_reason() is None:  # another local user: no key to read, refused at the port
        probe = ("import socket, sys\n"
                 "try:\n    open(sys.argv[1]).read(); print('read the key')\nexcept OSError as e:\n"
                 "    print(type(e).__name__)\n"
                 "s = socket.create_connection(('127.0.0.1', int(sys.argv[2])))\n"
                 "s.sendall(b'PTDLNK01' + bytes(64)); s.settimeout(30)\n"
                 "got = b''\n"
                 "while chunk := s.recv(4096):\n    got += chunk\n"
                 "print('closed' if len(got) == 40 else f'answered {len(got)}')\n")  # the nonce, no proof
        key_file = run.tmp / "home" / "ptdash" / "link.key"
        with users.throwaway_user() as intruder:
            result = users.as_user(intruder, users.system_python(), "-c", probe, str(key_file), str(run.port + 1))
        assert result.stdout.split() == ["PermissionError", "closed"], (result.stdout, result.stderr)
    step = run.last_step(1)
    run.wait_step(step + 10, rank=1)  # training went on through all of it
    log = (run.run_dir / "engine.log").read_text()
    assert "does not hold this job's key" in log and "another-job" in log and "Traceback" not in log
    assert any("the node port refused" in e.message for e in _events(run))

    paused = run.send("pause")
    run.resume_after_hold(paused, ranks=(0, 1))  # no step on either node while paused
    clip = run.send("clip", 0.25)
    lr = run.send("lr_scale", 0.5)
    assert clip.ok and lr.ok, (clip, lr)
    for rank in (0, 1):
        run.wait_step(max(clip.step, lr.step) + 5, rank=rank)
        steps, values = run.series("grad/clip_max", rank=rank)
        assert steps and steps[0] == clip.step + 1 and all(v == 0.25 for v in values), rank
        steps, values = run.series("opt/lr/group0", rank=rank)
        lrs = dict(zip(steps, values))
        assert lrs[lr.step] == pytest.approx(0.05) and lrs[lr.step + 1] == pytest.approx(0.025), rank
    stop = run.send("stop")
    assert stop.ok
    assert run.node1.wait(120) == 0 and run.proc.wait(120) == 0  # every launcher exits as the script did
    out = run.output()  # node 0's output.log: node 1's output came over the link
    assert "rank 0 finally ran" in out and "rank 1 finally ran" in out, out[-2000:]
    node1_said = (run.tmp / "node1.out").read_text()
    assert f"report to the run on {socket.gethostname()}: {run.run_dir}" in node1_said \
        or f"reports to the run on {socket.gethostname()}: {run.run_dir}" in node1_said, node1_said
    p0, p1 = torch.load(run.n0 / "params-0.pt"), torch.load(run.n1 / "params-1.pt")
    assert all(torch.equal(p0[k], p1[k]) for k in p0)  # identical replicas after the live clip and LR
    info = run.info()
    assert info.status == "stopped" and info.world_size == 2
    assert info.hosts == {"0": socket.gethostname(), "1": NODE1}
    with run.store() as s:
        assert s.last_step(0) >= stop.step and s.last_step(1) >= stop.step
    assert "rank channel up: 2 ranks on 2 hosts" in [e.message for e in _events(run)]


@needs_unshare
def test_a_killed_node_is_named_with_its_ranks_and_the_run_ends_as_torchrun_ends_it(nodes):
    run = nodes("--sleep", "0.02")
    run.stepping(3)
    for pid in processes_in(run.n1):  # node 1 goes away at once: launcher and rank
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    lost = wait_for(lambda: [e for e in _events(run) if e.kind == "node" and events.read(e).lost], 60, what="the lost node")
    node = events.read(lost[0])
    assert (node.node, node.host, node.ranks) == (1, NODE1, (1,)) and node.why, node
    assert lost[0].message.startswith(f"node 1 ({NODE1}) lost, with rank 1:"), lost[0].message
    code = run.proc.wait(180)
    assert code != 0  # node 0's rank fails in its next collective; torchrun's agent ends the job
    info = run.info()
    assert info.status == "crashed" and info.lost_nodes == [{"node": 1, "host": NODE1, "ranks": [1]}]
    assert info.detail.startswith(f"node 1 ({NODE1}) was lost; then rank 0 "), info.detail
    wait_for(lambda: not processes_in(run.n0) and not processes_in(run.n1), 60, what="nothing left behind")


@needs_unshare
def test_users_own_torchrun_on_two_nodes_reports_every_rank_to_the_hub(tmp_path):
    """``torchrun --nnodes 2 --rdzv-backend c10d ... -m ptdash.bootstrap``: rank 0's engine is the
    hub, wherever the rendezvous put it; the other node's rank reaches it over TCP."""
    n0, n1, home, runtime = (tmp_path / n for n in ("n0", "n1", "home", "rt0"))
    for d in (n0, n1, home, runtime):
        d.mkdir(mode=0o700)
    port = _ports()
    env = {**ENV, "XDG_CONFIG_HOME": str(home), "XDG_RUNTIME_DIR": str(runtime)}

    def torchrun(node: int) -> list[str]:
        return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
                "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                "--rdzv-id", "job-31", "--local-addr", "127.0.0.1", "-m", "ptdash.bootstrap", str(DDP),
                "--steps", "40", "--sleep", "0.02"]
    with open(tmp_path / "node0.out", "w") as out0, open(tmp_path / "node1.out", "w") as out1:
        node0 = subprocess.Popen(torchrun(0), cwd=n0, env=env, stdout=out0, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL)
        node1 = _node1(torchrun(1), n1, env, out1, hidden=(n0, runtime))
        try:
            assert node0.wait(180) == 0 and node1.wait(180) == 0, \
                (tmp_path / "node0.out").read_text()[-3000:] + (tmp_path / "node1.out").read_text()[-3000:]
        finally:
            for proc in (node0, node1):
                if proc.poll() is None:
                    proc.kill()
            kill_all(processes_in(n0) + processes_in(n1))
    runs = [p.parent for n in (n0, n1) for p in (n / "ptdash-runs").glob("*/run.json")]
    assert len(runs) == 1, runs  # one run; the other node has a node dir of its own (under .nodes)
    info = rundir.read_info(runs[0])
    assert info.status == "finished" and info.world_size == 2 and set(info.hosts.values()) == \
        {socket.gethostname(), NODE1}
    with StoreReader(runs[0] / "metrics.db") as s:
        assert s.last_step(0) == 40 and s.last_step(1) == 40
        messages = [e.message for e in s.events()]
    assert "rank channel up: 2 ranks on 2 hosts" in messages


def test_another_nodes_ptdash_given_node_0s_run_dir_on_a_shared_home_makes_its_own_beside_it(tmp_path):
    shared = tmp_path / "runs" / "exp"
    shared.mkdir(parents=True)
    (shared / "run.json").write_text("{}")  # node 0's, seen through the shared file system
    port = _ports()
    out = open(tmp_path / "node1.out", "w")
    front = subprocess.Popen([sys.executable, "-m", "ptdash.tui.cli", "--headless", "--nnodes", "2", "--node-rank",
                              "1", "--rdzv-endpoint", f"127.0.0.1:{port}", "--run-dir", str(shared), str(DDP)],
                             cwd=tmp_path, env=ENV, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        made = wait_for(lambda: list((tmp_path / "runs" / rundir.NODES).glob("*-exp-node1/run.json")), 60,
                        what="node 1's own dir", interval=0.2)
        assert rundir.read_info(made[0].parent).config is not None
        assert sorted(p.name for p in shared.iterdir()) == ["run.json"]  # node 0's dir untouched
        wait_for(lambda: "node 1 of 2: its ranks report to the hub on 127.0.0.1" in (tmp_path / "node1.out").read_text(),
                 30, what="node 1's front to say where its ranks report")
    finally:
        front.kill()
        front.wait()
        out.close()
        kill_all(processes_in(tmp_path))
