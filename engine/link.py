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

Frames are a 4-byte big-endian length and a JSON object. Stdlib only.
"""

from __future__ import annotations

import json
import logging
import queue
import socket
import struct
import threading
from pathlib import Path

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


def connect(path: Path, token: str, rank: int, world: int, role: str, timeout: float = 30.0) -> socket.socket:
    """A connection to the hub, past its hello; raises LinkError with the hub's reason."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(str(path))
        send(sock, {"hello": role, "token": token, "rank": rank, "world": world})
        answer = recv(sock)
    except (FileNotFoundError, ConnectionRefusedError) as exc:  # from connect: no socket, or no listener
        sock.close()
        raise HubNotListening(f"cannot reach the ptdash hub at {path}: {exc}") from None
    except (OSError, ValueError) as exc:
        sock.close()
        raise LinkError(f"cannot reach the ptdash hub at {path}: {exc}") from None
    if not answer or not answer.get("ok"):
        sock.close()
        raise LinkError(f"the ptdash hub refused rank {rank}: {(answer or {}).get('error', 'no answer')}")
    sock.settimeout(None)
    return sock


class Link:
    """One rank's two connections to the hub (see the module docstring)."""

    def __init__(self, path: Path, token: str, rank: int, world: int) -> None:
        self.rank = rank
        self._ctl = connect(path, token, rank, world, "control")
        self._data = connect(path, token, rank, world, "data")
        self._queue: queue.Queue = queue.Queue(SEND_QUEUE)
        self.dropped = 0
        """Flushes dropped because the hub did not take them in time."""
        self._sender = threading.Thread(target=self._send_loop, name="ptdash-link", daemon=True)
        self._sender.start()

    def request(self, obj: dict) -> dict:
        """Send on the control connection and wait for the answer (training thread only)."""
        send(self._ctl, obj)
        answer = recv(self._ctl)
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
                send(self._data, obj)
            except (OSError, ValueError) as exc:
                log.warning("rank link: cannot send to the hub: %s", exc)
                return

    def close(self, timeout: float = 10.0) -> None:
        """Send what is queued, then close both connections."""
        self._queue.put(None)
        self._sender.join(timeout)
        for sock in (self._data, self._ctl):
            try:
                sock.close()
            except OSError:
                pass
