"""The rank link: how a training rank in another process reaches the hub.

The hub is the process ptdash started (it owns the run dir, the store and the dashboard
socket; see hub.py). Every other process that trains (a rank started by torchrun, by
``mp.spawn``, or by a framework re-executing the interpreter) connects to the hub's
Unix socket twice: a *control* connection, used by the training thread for requests that
wait for an answer (may the ranks agree on commands? the command exchange itself), and a
*data* connection, used by the flusher thread to hand over rows, events and readings
without waiting for anything.

Nothing travels through the job's TCP store. The socket sits in the user's private
directory (0700), the hub checks each peer's uid with SO_PEERCRED and the run's token
(readable by its owner only), and takes a rank's pid from the kernel, not from a message.

A rank on another node than the hub's makes the same two connections over TCP, through
the authenticated link (shared/authlink.py: the job's key, a MAC on every frame); its
hello says which node and host it is on (nodeport.py serves it). Both kinds of
connection carry the same JSON objects: ``Conn`` is either.

Frames are a 4-byte big-endian length and a JSON object. Stdlib only.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import socket
import struct
import threading
from pathlib import Path
from typing import Callable

from .shared import authlink
from .shared.private import peer_uid

log = logging.getLogger("ptdash.link")

_HEADER = struct.Struct(">I")

MAX_LINK_FRAME = 64 * 1024 * 1024
"""A flush of a rank with many parameters can be large; nothing bigger is read."""

SEND_QUEUE = 256
"""Flushes a rank keeps for the hub while the hub is slow; beyond, the oldest are dropped."""


class LinkError(ConnectionError):
    """The hub cannot be reached or refused this rank; the message says why."""


class HubNotListening(LinkError):
    """Nothing listens at the hub's socket (yet): the hub's engine may still be starting."""


class HubBusy(LinkError):
    """The hub's port closed this connection in its handshake (a flood of connections holds
    it, the network dropped it): trying again later may get in."""


def socket_path(control_socket: str | Path) -> Path:
    """The hub's rank socket, next to the run's control socket in the private directory."""
    path = Path(control_socket)
    return path.with_name(path.stem + "-ranks.sock")


def send(sock: socket.socket, obj: dict) -> None:
    body = json.dumps(obj, separators=(",", ":")).encode()  # NaN as NaN: both ends are Python
    sock.sendall(_HEADER.pack(len(body)) + body)


def recv(sock: socket.socket) -> dict | None:
    """The next frame, or None when the peer closed the connection."""
    header = _read_exactly(sock, _HEADER.size)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    if size > MAX_LINK_FRAME:
        raise LinkError(f"a frame of {size} bytes is larger than {MAX_LINK_FRAME}")
    body = _read_exactly(sock, size)
    if body is None:
        return None
    obj = json.loads(body)
    if not isinstance(obj, dict):
        raise LinkError("a frame that is not a JSON object")
    return obj


def _read_exactly(sock: socket.socket, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class Conn:
    """One connection to the hub (or, at the hub, from a rank): JSON objects both ways."""

    def __init__(self, sock: socket.socket | None = None, channel: authlink.Channel | None = None) -> None:
        self.sock, self.channel = sock, channel
        self.welcome: dict = {}
        """The hub's answer to this connection's hello."""

    def send(self, obj: dict) -> None:
        if self.channel is not None:
            self.channel.send(json.dumps(obj, separators=(",", ":")).encode())
        else:
            send(self.sock, obj)

    def recv(self) -> dict | None:
        """The next object, or None when the peer closed; LinkError (or OSError) when damaged."""
        if self.channel is None:
            return recv(self.sock)
        try:
            payload = self.channel.recv()
        except authlink.LinkRefused as exc:
            raise LinkError(str(exc)) from None
        if payload is None:
            return None
        obj = json.loads(payload)
        if not isinstance(obj, dict):
            raise LinkError("a frame that is not a JSON object")
        return obj

    def settimeout(self, timeout: float | None) -> None:
        (self.channel.sock if self.channel is not None else self.sock).settimeout(timeout)

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()
        else:
            try:
                # Shut down first: a thread blocked reading this socket (a rank's link reader)
                # would otherwise keep it open, and the peer would never see it close.
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            try:
                self.sock.close()
            except OSError:
                pass


def _open(target, timeout: float) -> Conn:
    """A Conn to ``target``: a Unix socket path, or ``(host, port, key)`` of the hub's TCP port."""
    if isinstance(target, (str, Path)):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(str(target))
            uid = peer_uid(sock)  # the run's token goes to a process of this user only
        except OSError:
            sock.close()
            raise
        if uid != os.getuid():
            sock.close()
            raise LinkError(f"the socket {target} is served by uid {uid}, not by this user: the token was not sent")
        return Conn(sock=sock)
    host, port, key = target
    return Conn(channel=authlink.dial(host, port, key, timeout=timeout))


def describe(target) -> str:
    """Where the hub is, for messages."""
    return str(target) if isinstance(target, (str, Path)) else f"{target[0]}:{target[1]}"


def connect(target, token: str, rank: int, world: int, role: str, timeout: float = 30.0,
            extra: dict | None = None) -> Conn:
    """A connection to the hub, past its hello; raises LinkError with the hub's reason.
    ``extra``: what a rank on another node says of itself (nodeport.py checks it)."""
    try:
        conn = _open(target, timeout)
    except (FileNotFoundError, ConnectionRefusedError) as exc:  # no socket, or no listener (yet)
        raise HubNotListening(f"cannot reach the ptdash hub at {describe(target)}: {exc}") from None
    except authlink.LinkRefused as exc:
        kind = HubBusy if exc.transient else LinkError
        raise kind(f"cannot reach the ptdash hub at {describe(target)}: {exc}") from None
    except LinkError:
        raise
    except OSError as exc:  # reset, timed out: a port held by a flood, a network in trouble
        kind = LinkError if isinstance(target, (str, Path)) else HubBusy
        raise kind(f"cannot reach the ptdash hub at {describe(target)}: {exc}") from None
    try:
        conn.send({"hello": role, "token": token, "rank": rank, "world": world, "pid": os.getpid(), **(extra or {})})
        answer = conn.recv()
    except (OSError, ValueError) as exc:
        conn.close()
        raise LinkError(f"cannot reach the ptdash hub at {describe(target)}: {exc}") from None
    if not answer or not answer.get("ok"):
        conn.close()
        who = f"rank {rank}" if rank >= 0 else f"this node's {role}"
        raise LinkError(f"the ptdash hub refused {who}: {(answer or {}).get('error', 'no answer')}")
    conn.settimeout(None)
    conn.welcome = answer
    return conn


class Link:
    """One rank's two connections to the hub (see the module docstring)."""

    def __init__(self, target, token: str, rank: int, world: int, extra: dict | None = None,
                 answer: Callable[[dict], dict | None] = lambda frame: None) -> None:
        self.rank = rank
        self._answer = answer
        """What this rank says to a request the hub sends on the data connection (its stacks)."""
        self._ctl = connect(target, token, rank, world, "control", extra=extra)
        try:
            self._data = connect(target, token, rank, world, "data", extra=extra)
        except LinkError:
            self._ctl.close()
            raise
        self._queue: queue.Queue = queue.Queue(SEND_QUEUE)
        self.dropped = 0
        """Flushes dropped because the hub did not take them in time."""
        self._sender = threading.Thread(target=self._send_loop, name="ptdash-link", daemon=True)
        self._sender.start()
        threading.Thread(target=self._read_loop, name="ptdash-link-read", daemon=True).start()

    def _read_loop(self) -> None:
        """Answer the hub's requests on the data connection: from this thread, never the training one."""
        try:
            while (frame := self._data.recv()) is not None:
                reply = self._answer(frame)
                if reply is not None:
                    self.post(reply)
        except (OSError, ValueError):
            return  # closed: the link is ending

    def request(self, obj: dict) -> dict:
        """Send on the control connection and wait for the answer (training thread only)."""
        self._ctl.send(obj)
        answer = self._ctl.recv()
        if answer is None:
            raise LinkError("the ptdash hub closed the rank link")
        return answer

    def post(self, obj: dict) -> None:
        """Queue for the data connection; never blocks (the oldest queued item gives way)."""
        while True:
            try:
                self._queue.put_nowait(obj)
                return
            except queue.Full:
                try:
                    self._queue.get_nowait()
                    self.dropped += 1
                except queue.Empty:
                    pass

    def _send_loop(self) -> None:
        while True:
            obj = self._queue.get()
            if obj is None:
                return
            try:
                self._data.send(obj)
            except (OSError, ValueError) as exc:
                log.warning("rank link: cannot send to the hub: %s", exc)
                return

    def close(self, timeout: float = 10.0) -> None:
        """Send what is queued, then close both connections."""
        self._queue.put(None)
        self._sender.join(timeout)
        for conn in (self._data, self._ctl):
            conn.close()
