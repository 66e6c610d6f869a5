"""The hub's TCP port: how the ranks and launchers of the other nodes reach node 0's hub.

It listens on one address, the one the rendezvous uses on this machine (nodes.py), through
the authenticated link (shared/authlink.py, shared/linkport.py): a peer that does not hold
the job's key never gets past the handshake, nor holds the port with idle connections.
Past it, the first frame is a hello that must name this job (its rendezvous id), a node
other than 0 and within the job's nodes, and the same ptdash options as node 0's (the
replicas would differ otherwise); anything else is refused with the reason, logged, and
journaled (throttled). Then:

- a rank's *control* and *data* connections are served by the hub as a local rank's are
  (hub.py), with its host and node for the Ranks tab and for naming a lost node;
- a node's *launcher* (ptdash's own, on that node) sends its ranks' output, appended to
  the run's output.log, and says goodbye with its exit status. Its link closing without
  one names the node lost. The hub can send it ``kill`` (``ptdash ctl kill``), and ask it for
  its ranks' /proc state (a rank that does not answer for its stacks: stopped, in the kernel...).

TCP keepalive (authlink) ends a connection to a node whose network was cut.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from pathlib import Path
from typing import Callable

from . import link
from .shared import authlink, events, linkport, perms
from .shared.throttle import Throttle

log = logging.getLogger("ptdash.nodeport")

HELLO_TIMEOUT = 10.0
"""Seconds an authenticated peer has to say who it is."""

MAX_HOST = 255

PROC_SECONDS = 2.0
"""How long the hub waits for the other nodes' launchers to say their ranks' /proc state."""

HUB_ONLY = frozenset({"pause_timeout", "stall_seconds", "steps"})
"""Options only the hub acts on (a terminal on node 0 and none on node 1 set the pause
timeout differently): the others must be the same on every node."""


def _shared(config) -> dict | None:
    return {k: v for k, v in config.items() if k not in HUB_ONLY} if isinstance(config, dict) else None


class NodePort:
    """Serves the other nodes for ``hub``; ``config`` is the run's options (RunConfig.to_json()),
    ``run`` what a node's launcher is told of the run (its dir, id, host)."""

    def __init__(self, hub, host: str, port: int, key: bytes, job: str, config: dict, output: Path, run: dict,
                 event: Callable[..., object], nodes: int | None = None) -> None:
        self._hub, self._key, self._job, self._config, self._run = hub, key, job, config, run
        self._nodes_in_job = nodes
        """How many nodes the job has, when known: a hello from a node past them is refused."""
        self._event = event
        self._output = output
        self._out_lock = threading.Lock()
        self._out_fd: int | None = None
        self._nodes: dict[int, link.Conn] = {}
        self._lock = threading.Lock()
        self._states: dict[int, dict[int, dict]] = {}
        """The launchers' answers to each ``proc_states`` request, by node."""
        self._states_cond = threading.Condition()
        self._ids = itertools.count(1)
        self._throttle = Throttle(burst=3, window=60.0)
        self.host, self.port = host, port
        self.listener: linkport.Listener | None = None

    def start(self) -> None:
        """Listen (OSError when the port is taken: the caller says so)."""
        self.listener = linkport.Listener(self.host, self.port, self._key, self._peer, name="ptdash-nodeport",
                                          on_refuse=self._journal_refusal)
        self.host, self.port = self.listener.address

    def stop(self) -> None:
        if self.listener is not None:
            self.listener.close()
        with self._out_lock:
            if self._out_fd is not None:
                os.close(self._out_fd)
                self._out_fd = None

    def _journal_refusal(self, peer: str, reason: str) -> None:
        allowed, held = self._throttle.allow()
        if allowed:
            self._event(events.Warned(peer=peer), f"the node port refused {peer}: {reason}"
                        + (f" ({held} more refusals since the last note)" if held else ""))

    # ------------------------------------------------------------------ peers

    def _peer(self, channel: authlink.Channel) -> None:
        conn = link.Conn(channel=channel)
        conn.settimeout(HELLO_TIMEOUT)
        try:
            hello = conn.recv()
        except (OSError, ValueError) as exc:
            raise authlink.LinkRefused(f"no hello: {exc}") from None
        reason = self._check(hello)
        if reason:
            try:
                conn.send({"ok": False, "error": reason})
            except OSError:
                pass
            raise authlink.LinkRefused(reason)
        host, node = hello["host"], hello["node"]
        if hello["hello"] == "node":
            self._serve_node(conn, host, node)
        else:
            pid = hello.get("pid") if isinstance(hello.get("pid"), int) else 0
            self._hub.serve_rank(conn, hello, pid, host=host, node=node)

    def _check(self, hello) -> str | None:
        """Why a hello is refused, or None."""
        if not isinstance(hello, dict) or hello.get("hello") not in ("control", "data", "node"):
            return "the first frame must be a hello"
        if hello.get("job") != self._job:
            return f"this is the hub of job {self._job!r}, not {str(hello.get('job'))[:64]!r}"
        node, host = hello.get("node"), hello.get("host")
        if not isinstance(node, int) or isinstance(node, bool) or node < 1:
            return f"node {node!r} is not another node than the hub's"
        if self._nodes_in_job is not None and node >= self._nodes_in_job:
            return f"node {node} is not a node of this job of {self._nodes_in_job} nodes (0 to {self._nodes_in_job - 1})"
        if not isinstance(host, str) or not host or len(host) > MAX_HOST or not host.isprintable():
            return "the hello names no host"
        theirs, ours = _shared(hello.get("config")), _shared(self._config)
        if theirs != ours:
            keys = sorted(k for k in set(ours) | set(theirs or {}) if theirs is None or theirs.get(k) != ours.get(k))
            return (f"node {node} was started with other ptdash options than node 0 ({', '.join(keys[:5]) or 'config'} "
                    "differ): give every node the same options")
        return None

    def _serve_node(self, conn: link.Conn, host: str, node: int) -> None:
        with self._lock:
            if node in self._nodes:
                raise authlink.LinkRefused(f"node {node} already has its launcher's link")
            self._nodes[node] = conn
        said_bye = False
        try:
            conn.send({"ok": True, **self._run})
            conn.settimeout(None)
            self._event(events.Node(node=node, host=host), f"node {node} ({host}) joined the run")
            while (frame := conn.recv()) is not None:
                if isinstance(frame.get("output"), str):
                    self._append(frame["output"])
                elif "proc" in frame:
                    self._states_came(node, frame)
                elif "bye" in frame:
                    said_bye = True
        except (OSError, ValueError) as exc:
            log.warning("the link of node %d's launcher failed: %s", node, exc)
        finally:
            with self._lock:
                self._nodes.pop(node, None)
            if not said_bye:
                self._hub.node_lost(node, host, "its launcher's link closed without a goodbye "
                                    "(killed, or the network cut)")

    def _append(self, text: str) -> None:
        """The node's output into output.log, whole lines at a time (the launcher sends them so)."""
        data = text.encode("utf-8", "surrogateescape")
        with self._out_lock:
            try:
                if self._out_fd is None:
                    self._out_fd = perms.open_file(self._output, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
                os.write(self._out_fd, data)
            except OSError as exc:  # a full disk: that node's output is lost, never the training
                log.warning("cannot write another node's output to %s: %s", self._output, exc)

    def proc_states(self, pids: dict[int, list[int]], timeout: float = PROC_SECONDS) -> dict[tuple[int, int], tuple]:
        """``{(node, pid): (state, wchan)}`` of ranks on the other nodes, as each node's launcher
        reads them from its /proc (``pids``: by node); a node that does not answer in ``timeout``
        says nothing."""
        req = next(self._ids)
        with self._lock:
            conns = {node: self._nodes[node] for node in pids if node in self._nodes}
        with self._states_cond:
            self._states[req] = {}
        asked = set()
        for node, conn in conns.items():
            try:
                conn.send({"proc": req, "pids": pids[node]})
                asked.add(node)
            except OSError:
                pass
        deadline = time.monotonic() + timeout
        with self._states_cond:
            while not asked <= set(self._states[req]) and (left := deadline - time.monotonic()) > 0:
                self._states_cond.wait(left)
            answers = self._states.pop(req)
        return {(node, int(pid)): tuple(state) for node, states in answers.items() for pid, state in states.items()
                if str(pid).isdigit() and isinstance(state, list) and len(state) == 2}

    def _states_came(self, node: int, frame: dict) -> None:
        states = frame.get("states")
        with self._states_cond:
            if frame.get("proc") in self._states and isinstance(states, dict):
                self._states[frame["proc"]][node] = states
                self._states_cond.notify_all()

    def kill_nodes(self) -> None:
        """``ptdash ctl kill``: every node's launcher kills its ranks at once."""
        with self._lock:
            conns = list(self._nodes.values())
        for conn in conns:
            try:
                conn.send({"kill": True})
            except OSError:
                pass
