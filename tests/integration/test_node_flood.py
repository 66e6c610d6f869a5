"""The hub's port under a flood (issue 41): peers without the key hold every connection they
can, idle, opening another whenever the hub closes one, from node 1's own address and from
another; node 1 still joins (its launcher and its rank), trains into the hub's store and
stops with the run. A node past the job's nodes is refused. Two nodes as test_nodes.py runs
them (node 1 in namespaces of its own), through the real CLI."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from integration import test_nodes
from integration.test_nodes import NODE1, needs_unshare, nodes  # noqa: F401 - nodes: the fixture
from ptdash import link, noderelay
from ptdash.shared import authlink, linkport
from support.runner import ENV

pytestmark = pytest.mark.slow


class Flood:
    """``count`` idle connections from each source address to the hub's port: each takes the
    server's nonce and never answers; one the hub closes is opened again after ``pause`` s."""

    def __init__(self, port: int, sources: dict[str, int], pause: float = 0.1) -> None:
        self.port, self.pause = port, pause
        self.nonces = 0
        """Connections the hub gave a nonce, so far: how often the flood held a place."""
        self.stop = threading.Event()
        self.listening = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._probe, daemon=True)]
        self._threads += [threading.Thread(target=self._hold, args=(source,), daemon=True)
                          for source, count in sources.items() for _ in range(count)]
        for thread in self._threads:
            thread.start()

    def _probe(self) -> None:
        """One thread watches for the port to open (the hub starts after the rendezvous)."""
        while not self.stop.is_set() and not self.listening.is_set():
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=5).close()
                self.listening.set()
            except OSError:
                time.sleep(0.05)

    def _hold(self, source: str) -> None:
        while not self.stop.is_set():
            if not self.listening.wait(0.5):
                continue
            try:
                sock = socket.create_connection(("127.0.0.1", self.port), timeout=10, source_address=(source, 0))
            except OSError:
                time.sleep(self.pause)
                continue
            try:
                if sock.recv(64):
                    with self._lock:
                        self.nonces += 1
                sock.settimeout(0.5)
                while not self.stop.is_set():
                    try:
                        if not sock.recv(64):
                            break  # the hub closed it: open another
                    except socket.timeout:
                        continue
            except OSError:
                pass
            finally:
                sock.close()
            time.sleep(self.pause)

    def end(self) -> None:
        self.stop.set()
        for thread in self._threads:
            thread.join(10)


@needs_unshare
def test_a_node_joins_while_a_flood_without_the_key_holds_the_hubs_port(nodes, monkeypatch):
    port = test_nodes._ports()
    monkeypatch.setattr(test_nodes, "_ports", lambda: port)
    # Over the per-address cap from node 1's own address (127.0.0.1), and from another.
    per_source = linkport.MAX_PER_ADDRESS + 8
    flood = Flood(port + 1, {"127.0.0.1": per_source, "127.0.0.2": per_source})
    try:
        run = nodes("--sleep", "0.02")
        run.stepping(5)  # node 1's rank trains into the hub's store: it got in
        held = flood.nonces
        assert held >= 2 * per_source, held  # every flood connection held a place at least once
        messages = [e.message for e in test_nodes._events(run)]
        assert f"node 1 ({NODE1}) joined the run" in messages, messages
        log = (run.run_dir / "engine.log").read_text()
        assert "closed in its handshake for a newer connection" in log, log[-3000:]
        key = bytes.fromhex((run.tmp / "home" / "ptdash" / "link.key").read_text())
        with pytest.raises(link.LinkError) as refused:  # the key, but a node the job does not have
            link.connect(("127.0.0.1", port + 1, key), "", 2, 2, "control", timeout=30,
                         extra={"job": "job-31", "node": 2, "host": "x", "config": {}})
        assert "node 2 is not a node of this job of 2 nodes (0 to 1)" in str(refused.value), refused.value
        step = run.last_step(1)
        run.wait_step(step + 10, rank=1)
        assert flood.nonces > held  # the flood went on all the while
        stop = run.send("stop")
        assert stop.ok, stop
        assert run.node1.wait(120) == 0 and run.proc.wait(120) == 0
        out = run.output()  # node 1's output came over its link, through the flood
        assert "rank 1 finally ran" in out, out[-2000:]
    finally:
        flood.end()


RELAY = """
import sys, time
from pathlib import Path
from ptdash.noderelay import NodeRelay
relay = NodeRelay("127.0.0.1", int(sys.argv[1]), bytes.fromhex(sys.argv[2]),
                  {"node": 1, "job": "job-31", "host": "n1"}, Path(sys.argv[3]), "rank 1")
print("a line of rank 1", flush=True)
deadline = time.monotonic() + 90
while relay.conn is None and time.monotonic() < deadline:  # the node's ranks train a while
    time.sleep(0.05)
relay.close(0)
"""


def test_a_node_the_hubs_port_closed_in_its_handshake_tries_again_with_backoff_and_says_so(tmp_path):
    """A real node launcher's relay (its own process) against a port that closes its first
    two connections in the handshake, as a port held by a flood closes its oldest: it says
    it could not join yet, tries again, joins, and its output and goodbye arrive."""
    key = os.urandom(32)
    server = socket.create_server(("127.0.0.1", 0))
    frames: list[dict] = []

    def hub() -> None:
        for attempt in range(3):
            sock, _ = server.accept()
            if attempt < 2:
                sock.sendall(authlink.MAGIC + os.urandom(authlink.NONCE))  # a nonce, then closed
                sock.close()
                continue
            conn = link.Conn(channel=authlink.server_handshake(sock, key))
            frames.append(conn.recv())
            conn.send({"ok": True, "run_dir": "/runs/exp", "run_id": "r", "host": "hub0"})
            while (frame := conn.recv()) is not None:
                frames.append(frame)
            conn.close()
    serving = threading.Thread(target=hub, daemon=True)
    serving.start()
    result = subprocess.run([sys.executable, "-c", RELAY, str(server.getsockname()[1]), key.hex(), str(tmp_path)],
                            capture_output=True, text=True, timeout=120, env=ENV)
    serving.join(30)
    server.close()
    said = result.stdout.splitlines()
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert said[0].startswith("ptdash: node 1 could not join the run yet: cannot reach the ptdash hub at "
                              "127.0.0.1:"), said
    assert "the peer closed the connection during the handshake" in said[0] and \
        f"trying again, every {noderelay.RETRY_FIRST:g} s at first and at most every {noderelay.RETRY_MOST:g} s" \
        in said[0], said
    assert said[1] == "ptdash: node 1 joined the run after 3 tries", said
    assert "report" in said[2] and "/runs/exp" in said[2], said
    assert frames[0]["hello"] == "node" and {"output": "a line of rank 1\n"} in frames and frames[-1] == {"bye": 0}
