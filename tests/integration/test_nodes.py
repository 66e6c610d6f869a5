"""Two nodes on one machine, each with its own ``ptdash`` launcher, as ``torchrun --nnodes 2``
runs them: node 1 in mount and UTS namespaces of its own (another host name; node 0's run
dir and private directory hidden under empty file systems), so the only way between them
is the hub's authenticated TCP port. Node 1's rank is in node 0's store; pause, clip, LR and
stop reach both nodes at one step and the replicas stay identical; peers without the key,
of another job, another local user and garbage are refused while training goes on; a
killed node is named with its rank and the run ends as torchrun ends it, and so is a node whose
network is cut (node 1 in a network namespace of its own, joined by a veth pair)."""

from __future__ import annotations

import os
import random
import shlex
import shutil
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
from ptdash.shared.stacks import read
from ptdash.tui.stacks_cli import take_stacks
from support import users
from support.printed import each_ranks_printed
from support.runner import ENV, SCRIPTS, Run, kill_all, processes_in, wait_for

pytestmark = pytest.mark.slow

NODE1 = "ptdash-node1"
DDP = SCRIPTS / "ddp_train.py"


def _unshare_reason() -> str | None:
    """Why node 1 cannot have namespaces of its own here, or None."""
    if shutil.which("ip") is None:
        return "no ip command (iproute2) for the veth pair"
    try:
        probe = subprocess.run(["unshare", "--mount", "--uts", "--net", "true"], capture_output=True, text=True,
                               timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare cannot run: {exc}"
    return None if probe.returncode == 0 else f"unshare --mount --uts --net fails: {probe.stderr.strip()}"


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


def _node1(argv: list[str], cwd, env: dict, out, hidden, absent=None, net=None) -> subprocess.Popen:
    """``argv`` as node 1: empty file systems over ``hidden`` (node 0's dirs), a host name of
    its own; the shell proves node 0's files are out of sight (``absent``) before it starts.
    ``net`` (a Veth): a network of its own too, whose one way out is the veth pair; the shell
    waits for its end to be moved in and brings it up."""
    mounts = "; ".join(f"mount -t tmpfs -o mode=700 none {shlex.quote(str(d))} || exit 96" for d in hidden)
    check = f"test ! -e {shlex.quote(str(absent))} || exit 97; " if absent else ""
    wire = net.inside() if net else ""
    shell = f"{wire}{mounts}; hostname {NODE1} || exit 96; {check}exec {shlex.join(argv)}"
    spaces = ["--mount", "--uts", *(["--net"] if net else [])]
    return subprocess.Popen(["unshare", *spaces, "--propagation", "private", "sh", "-c", shell],
                            cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


class Veth:
    """A veth pair between this network and node 1's: node 0 at ``.host``, node 1 at ``.peer``
    (a /30 of 10.77/16 and interface names of the test's own, so that tests in parallel differ)."""

    def __init__(self, flag) -> None:
        n = random.randrange(1, 16000)
        self.net = f"10.77.{n // 64}.{(n % 64) * 4}"
        base = self.net.rsplit(".", 1)[0]
        last = (n % 64) * 4
        self.host, self.peer = f"{base}.{last + 1}", f"{base}.{last + 2}"
        self.outer, self.inner = f"pdh{n}", f"pdn{n}"
        self.flag = flag

    def inside(self) -> str:
        """The shell that, in node 1's namespaces, waits for its end and brings it up."""
        flag = shlex.quote(str(self.flag))
        return (f"while [ ! -e {flag} ]; do sleep 0.05; done; ip link set lo up && "
                f"ip addr add {self.peer}/30 dev {self.inner} && ip link set {self.inner} up || exit 95; ")

    def plug(self, pid: int) -> None:
        """The pair, one end moved into the namespaces of process ``pid``."""
        for cmd in (f"link add {self.outer} type veth peer name {self.inner} netns {pid}",
                    f"addr add {self.host}/30 dev {self.outer}", f"link set {self.outer} up"):
            subprocess.run(["ip", *cmd.split()], check=True, capture_output=True, timeout=30)

    def cut(self) -> None:
        subprocess.run(["ip", "link", "set", self.outer, "down"], check=True, capture_output=True, timeout=30)

    def remove(self) -> None:
        subprocess.run(["ip", "link", "del", self.outer], capture_output=True, timeout=30)


class TwoNodes(Run):
    """Node 0 (the hub, with the run dir) and node 1 (hidden from it), both headless."""

    def __init__(self, tmp_path, *args: str, net: bool = False) -> None:
        self.tmp = tmp_path
        self.n0, self.n1, home, runtime = (tmp_path / n for n in ("n0", "n1", "home", "rt0"))
        for d in (self.n0, self.n1, home, runtime):
            d.mkdir(mode=0o700)
        self.run_dir = self.n0 / "run"
        self.port = _ports()
        env = {**ENV, "XDG_CONFIG_HOME": str(home), "XDG_RUNTIME_DIR": str(runtime)}
        self.env = env
        self.veth = Veth(tmp_path / "plugged") if net else None
        addr = self.veth.host if net else "127.0.0.1"
        self.addr = addr
        common = ["--headless", "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-endpoint",
                  f"{addr}:{self.port}", "--rdzv-id", "job-31"]
        cli = [sys.executable, "-m", "ptdash.tui.cli"]
        env0, env1 = env, env
        if net:  # gloo's own sockets on the veth pair too (by default on the host name's address)
            env0 = {**env, "GLOO_SOCKET_IFNAME": self.veth.outer}
            env1 = {**env, "GLOO_SOCKET_IFNAME": self.veth.inner}
        self.out1 = open(tmp_path / "node1.out", "w")
        node1 = [*cli, *common, "--node-rank", "1", str(DDP), *args]
        if net:  # node 1's network first: node 0's address is on its pair
            self.node1 = _node1(node1, self.n1, env1, self.out1, hidden=(self.n0, runtime),
                                absent=self.run_dir / "run.json", net=self.veth)
            self.veth.plug(self.node1.pid)
        self.out = open(tmp_path / "node0.out", "w")
        self.proc = subprocess.Popen([*cli, *common, "--node-rank", "0", "--run-dir", str(self.run_dir), str(DDP),
                                      *args], cwd=self.n0, env=env0, stdout=self.out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        wait_for(lambda: (self.run_dir / "run.json").exists(), 60, what="node 0's run dir")
        if net:
            self.veth.flag.touch()
        else:
            self.node1 = _node1(node1, self.n1, env1, self.out1, hidden=(self.n0, runtime),
                                absent=self.run_dir / "run.json")
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
        if self.veth is not None:
            self.veth.remove()


@pytest.fixture
def nodes(tmp_path):
    made = []

    def start(*args, net=False):
        made.append(TwoNodes(tmp_path, *args, net=net))
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
    ranks = read(take_stacks(run.run_dir, timeout=60))  # rank 1 answers over the authenticated TCP link
    assert [(r.rank, r.answered, r.host) for r in ranks] == [(0, True, ""), (1, True, NODE1)], ranks
    assert all(any(f.own for f in r.training.frames) for r in ranks)  # the script's own lines, on both nodes
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
def test_a_stopped_rank_on_another_node_is_named_with_its_state_as_its_node_reads_it(nodes):
    """Rank 1, on node 1, stopped (SIGSTOP): it cannot answer for its stacks, and the hub cannot
    read another machine's /proc; node 1's launcher reads it and says so over its link."""
    run = nodes("--sleep", "0.02")
    run.stepping(3)
    (pid,) = [r.pid for r in read(take_stacks(run.run_dir, timeout=60)) if r.rank == 1]
    os.kill(pid, signal.SIGSTOP)
    try:
        ranks = read(take_stacks(run.run_dir, timeout=60))
    finally:
        os.kill(pid, signal.SIGCONT)
    one = next(r for r in ranks if r.rank == 1)
    assert (one.answered, one.host, one.pid) == (False, NODE1, pid), one
    assert one.state == "T (stopped)" and one.note == "no answer: its process is stopped (SIGSTOP or a debugger)", one
    run.wait_step(run.last_step(1) + 5, rank=1)  # it trains on once continued
    assert run.send("stop").ok
    assert run.node1.wait(120) == 0 and run.proc.wait(120) == 0


@needs_unshare
def test_a_node_whose_network_is_cut_is_named_with_its_ranks(nodes):
    """Node 1 in a network of its own, its one way to node 0 a veth pair; the pair goes down
    mid-run. Nothing closes a connection then (no FIN, no RST): the hub's TCP keepalive
    gives the node up, and it is named with its rank, as a killed node is."""
    run = nodes("--sleep", "0.02", net=True)
    run.stepping(3)
    assert run.info().hosts == {"0": socket.gethostname(), "1": NODE1}
    run.veth.cut()
    lost = wait_for(lambda: [e for e in _events(run) if e.kind == "node" and events.read(e).lost], 120,
                    what="the node cut off named lost")
    node = events.read(lost[0])
    assert (node.node, node.host, node.ranks) == (1, NODE1, (1,)), node
    assert lost[0].message.startswith(f"node 1 ({NODE1}) lost, with rank 1:") and "network" in node.why, lost[0]
    assert run.info().lost_nodes == [{"node": 1, "host": NODE1, "ranks": [1]}]
    # Rank 0 now waits in its collective until the process group's timeout, as under torchrun;
    # ``ctl kill`` ends node 0's side at once.
    subprocess.run([sys.executable, "-m", "ptdash.tui.cli", "ctl", str(run.run_dir), "kill"], env=run.env,
                   capture_output=True, timeout=60, check=True)
    assert run.proc.wait(120) != 0
    wait_for(lambda: not processes_in(run.n0), 60, what="node 0's rank gone")


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


@needs_unshare
def test_each_nodes_printed_metrics_are_its_ranks_own_at_its_steps(tmp_path):
    """``ptdash --nnodes 2`` on each node: node 1's rank relays its output into its launcher's
    pipe to the hub and reads it for metrics; its values reach the store over the rank link."""
    n0, n1, home, runtime = (tmp_path / n for n in ("n0", "n1", "home", "rt0"))
    for d in (n0, n1, home, runtime):
        d.mkdir(mode=0o700)
    port = _ports()
    env = {**ENV, "XDG_CONFIG_HOME": str(home), "XDG_RUNTIME_DIR": str(runtime)}
    run_dir = n0 / "run"

    def node(rank: int) -> list[str]:
        return [sys.executable, "-m", "ptdash.tui.cli", "--headless", "--nnodes", "2", "--nproc-per-node", "1",
                "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "job-31", "--node-rank", str(rank),
                *(["--run-dir", str(run_dir)] if rank == 0 else []), str(SCRIPTS / "ddp_printed.py")]
    with open(tmp_path / "node0.out", "w") as out0, open(tmp_path / "node1.out", "w") as out1:
        node0 = subprocess.Popen(node(0), cwd=n0, env=env, stdout=out0, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL)
        node1 = None
        try:
            wait_for(lambda: (run_dir / "run.json").exists(), 60, what="node 0's run dir")
            node1 = _node1(node(1), n1, env, out1, hidden=(n0, runtime), absent=run_dir / "run.json")
            assert node0.wait(180) == 0 and node1.wait(180) == 0, \
                (tmp_path / "node0.out").read_text()[-3000:] + (tmp_path / "node1.out").read_text()[-3000:]
        finally:
            for proc in (node0, node1):
                if proc is not None and proc.poll() is None:
                    proc.kill()
            kill_all(processes_in(n0) + processes_in(n1))
    assert rundir.read_info(run_dir).hosts == {"0": socket.gethostname(), "1": NODE1}
    each_ranks_printed(run_dir)


@needs_unshare
def test_under_your_own_torchrun_on_two_nodes_each_ranks_prints_are_read_as_its_own(tmp_path):
    """``torchrun --nnodes 2 ... -m ptdash.bootstrap``: each rank's fds stay torchrun's; its
    prints are read where it writes them and reach the hub over its rank link (TCP for node 1)."""
    n0, n1, home, runtime = (tmp_path / n for n in ("n0", "n1", "home", "rt0"))
    for d in (n0, n1, home, runtime):
        d.mkdir(mode=0o700)
    port = _ports()
    env = {**ENV, "XDG_CONFIG_HOME": str(home), "XDG_RUNTIME_DIR": str(runtime)}

    def torchrun(node: int) -> list[str]:
        return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
                "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                "--rdzv-id", "job-31", "--local-addr", "127.0.0.1", "-m", "ptdash.bootstrap",
                str(SCRIPTS / "ddp_printed.py")]
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
    (run_dir,) = [p.parent for n in (n0, n1) for p in (n / "ptdash-runs").glob("*/run.json")]
    # Each node's output is where its torchrun put it: both nodes' lines, together, as written.
    each_ranks_printed(run_dir, output=(tmp_path / "node0.out").read_text() + (tmp_path / "node1.out").read_text())


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
