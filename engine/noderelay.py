"""A node's launcher and the hub: ptdash's launcher on a node other than the hub's says where
the run is and streams its ranks' output to it.

The launcher's fds 1 and 2, which its ranks inherit, become a pipe. A thread copies what
comes to the node dir's output.log (a copy on this node) and keeps it for the hub; another
sends it, in whole lines, over the authenticated link (nodeport.py on node 0), which
appends it to the run's output.log. Until the hub answers (it starts with node 0's rank
0, after the rendezvous) the output waits in a bounded buffer (``OUTPUT_BUFFER``; beyond,
the oldest is dropped and the drop named); a hub whose port closed this node in its
handshake (a flood holds it) is tried again with backoff, said on the launcher's stdout. The hub's welcome says where the run is: the
launcher prints it on its own stdout. The hub may send ``kill``: the launcher kills
itself, and its ranks die with it (rankstart.die_with_parent). At the end it says goodbye.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from pathlib import Path

import psutil

from . import link
from .shared import stacks

log = logging.getLogger("ptdash.noderelay")

OUTPUT_BUFFER = 8 << 20
"""Bytes of output kept for a hub not reached yet."""
CHUNK = 60 << 10
"""Output sent in one frame at most."""
CLOSE_WAIT = 10.0
"""Seconds the end waits for the output still unsent."""
RETRY_FIRST, RETRY_MOST = 0.5, 8.0
"""Seconds between tries to join a hub whose port closed this node in its handshake: the
first wait, doubled each time up to the most."""


class NodeRelay:
    """See the module docstring. ``ranks``: which ranks this node runs, in words."""

    def __init__(self, host: str, port: int, key: bytes, hello: dict, node_dir: Path, ranks: str) -> None:
        self._target, self._hello, self._ranks = (host, port, key), hello, ranks
        self._cond = threading.Condition()
        self._buffer = bytearray()
        self._dropped = 0
        self._eof = False
        self._closing = False
        self.conn: link.Conn | None = None
        self._copy = os.open(node_dir / "output.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._stdout = os.dup(1)
        os.set_inheritable(self._stdout, False)
        read, write = os.pipe()
        self._read = read
        os.dup2(write, 1)
        os.dup2(write, 2)
        os.close(write)
        for target, name in ((self._read_loop, "ptdash-node-output"), (self._send_loop, "ptdash-node-link")):
            threading.Thread(target=target, name=name, daemon=True).start()

    def say(self, text: str) -> None:
        """One of ptdash's lines on the launcher's own stdout (not into the run's output)."""
        try:
            os.write(self._stdout, f"ptdash: {text}\n".encode("utf-8", "backslashreplace"))
        except OSError:
            pass

    def _read_loop(self) -> None:
        while True:
            try:
                data = os.read(self._read, 1 << 16)
            except InterruptedError:
                continue
            except OSError:
                data = b""
            with self._cond:
                if not data:
                    self._eof = True
                    self._cond.notify_all()
                    return
                try:
                    os.write(self._copy, data)
                except OSError:
                    pass  # a full disk here: the hub's copy is the run's
                self._buffer += data
                if len(self._buffer) > OUTPUT_BUFFER:
                    cut = len(self._buffer) - OUTPUT_BUFFER
                    self._dropped += cut
                    del self._buffer[:cut]
                self._cond.notify_all()

    def _connect(self) -> link.Conn | None:
        """The link to the hub, tried until it answers or the launcher ends; a hub whose port
        closed this node in its handshake (held by a flood) is tried again with backoff, and
        the first such failure and the join after it are said on this launcher's stdout."""
        wait, tries = RETRY_FIRST, 0
        while not self._closing:
            try:
                conn = link.connect(self._target, "", -1, 0, "node", extra=self._hello)
            except link.HubNotListening:
                time.sleep(0.2)
                continue
            except link.HubBusy as exc:
                tries += 1
                if tries == 1:
                    self.say(f"node {self._hello['node']} could not join the run yet: {exc}; trying again, "
                             f"every {RETRY_FIRST:g} s at first and at most every {RETRY_MOST:g} s")
                time.sleep(wait)
                wait = min(wait * 2, RETRY_MOST)
                continue
            except link.LinkError as exc:
                self.say(f"this node's output does not reach the run: {exc}")
                return None
            if tries:
                self.say(f"node {self._hello['node']} joined the run after {tries + 1} tries")
            return conn
        return None

    def _send_loop(self) -> None:
        conn = self._connect()
        if conn is None:
            return
        self.conn = conn
        self.say(welcome_line(conn.welcome, self._hello["node"], self._ranks))
        threading.Thread(target=self._orders, args=(conn,), name="ptdash-node-orders", daemon=True).start()
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._buffer or self._eof or self._closing, 1.0)
                cut = self._buffer.rfind(b"\n", 0, CHUNK) + 1
                if not cut and (len(self._buffer) >= CHUNK or self._eof or self._closing):
                    cut = min(len(self._buffer), CHUNK)
                chunk, dropped = bytes(self._buffer[:cut]), self._dropped
                del self._buffer[:cut]
                self._dropped = 0
                done = not self._buffer and (self._eof or self._closing)
                self._cond.notify_all()
            try:
                if dropped:
                    conn.send({"output": f"[ptdash] {dropped} bytes of node {self._hello['node']}'s output "
                                         "were dropped before the hub could be reached\n"})
                if chunk:
                    conn.send({"output": chunk.decode("utf-8", "surrogateescape")})
            except OSError as exc:
                log.warning("the link to the hub failed: %s", exc)
                return
            if done:
                return

    def _orders(self, conn: link.Conn) -> None:
        """What the hub tells this launcher: perhaps ``kill``, or to say its ranks' /proc state
        (``proc``: the hub asks for ranks that did not answer for their stacks)."""
        try:
            while (frame := conn.recv()) is not None:
                if frame.get("kill"):
                    os.kill(os.getpid(), signal.SIGKILL)
                elif isinstance(frame.get("proc"), int):
                    conn.send({"proc": frame["proc"], "states": proc_states(frame.get("pids"), os.getpid())})
        except (OSError, ValueError):
            pass

    def close(self, code: int) -> None:
        """The launcher ends with ``code``: the output still in the pipe goes, then goodbye."""
        for fd in (1, 2):  # the ranks are gone: this process held the pipe's last write end
            os.dup2(self._stdout, fd)
        with self._cond:
            self._cond.wait_for(lambda: self._eof and (not self._buffer or self.conn is None), CLOSE_WAIT)
            self._closing = True
            self._cond.notify_all()
        if self.conn is not None:
            try:
                self.conn.send({"bye": code})
            except OSError:
                pass
            self.conn.close()
        os.close(self._copy)


def welcome_line(answer: dict, node: int, ranks: str) -> str:
    """What a node's launcher prints once the hub answered."""
    where = answer.get("run_dir", "?")
    verb = "reports" if ranks.startswith("rank ") else "report"
    return (f"node {node} ({socket.gethostname()}): {ranks} {verb} to the run on {answer.get('host', '?')}: {where} "
            f"(watch it there: ptdash attach {where}); the output goes to its output.log")


MAX_PIDS = 4096
"""Processes one ``proc`` order may ask about."""


def descends(pid: int, ancestor: int) -> bool:
    """Whether process ``pid`` is ``ancestor``'s child, grandchild..."""
    try:
        return any(p.pid == ancestor for p in psutil.Process(pid).parents())
    except psutil.Error:
        return False


def proc_states(pids, launcher: int) -> dict[str, list[str]]:
    """``{pid: [state, wchan]}`` of the processes among ``pids`` that this launcher started
    (its ranks; nothing of another process of this machine is said)."""
    if not isinstance(pids, list):
        return {}
    wanted = [p for p in pids[:MAX_PIDS] if isinstance(p, int) and not isinstance(p, bool) and p > 1]
    return {str(p): list(stacks.process_state(p)) for p in wanted if descends(p, launcher)}
