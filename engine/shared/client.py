"""The client side of the control socket: the dashboard's and ``ptdash ctl``'s connection
to a run's engine (see transport.py for the server). It sends the run's token only to a
process of its own user (SO_PEERCRED), and a command holding a value JSON cannot carry (a
NaN) is refused here, never sent as null (wire.encode). Stdlib only."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

from . import wire
from .private import peer_uid
from .protocol import Hello, Message, Refused, TransportError, Welcome


class Client:
    """A blocking connection to a run's engine, used by the dashboard and ``ptdash ctl``."""

    def __init__(self, path: Path | str, token: str, name: str = "dashboard") -> None:
        self.path = str(path)
        self._token = token
        self._name = name
        self._reader = wire.FrameReader()
        self._pending: list[bytes] = []
        self._send_lock = threading.Lock()
        self.sock: socket.socket | None = None

    def connect(self, timeout: float = 5.0) -> Welcome:
        """Connect and authenticate; raise TransportError with a one-line reason."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        deadline = time.monotonic() + timeout
        try:
            while True:
                try:
                    sock.connect(self.path)
                    break
                except BlockingIOError:
                    # The engine's backlog is full (many clients at once): it will drain.
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.02)
        except FileNotFoundError:
            sock.close()
            raise TransportError(f"no engine is listening at {self.path} (has the run ended?)") from None
        except OSError as exc:
            sock.close()
            raise TransportError(f"cannot connect to {self.path}: {exc.strerror or exc}") from None
        try:
            # The token only to an engine of this user: whoever could put a socket at this path
            # (a directory another user may rename things in) would otherwise collect it.
            uid = peer_uid(sock)
        except OSError as exc:
            sock.close()
            raise TransportError(f"cannot tell who listens at {self.path}: {exc.strerror or exc}") from None
        if uid != os.getuid():
            sock.close()
            raise TransportError(f"the socket {self.path} is served by uid {uid}, not by you (uid {os.getuid()}): "
                                 "not an engine of yours; the run's token was not sent")
        self.sock = sock
        try:
            self.send(Hello(token=self._token, client=self._name))
        except TransportError:
            pass  # refused before our hello was read (too many clients): the reason waits for us
        try:
            msg = self.recv(timeout)
        except TransportError:
            self.close()
            raise
        if isinstance(msg, Refused):
            self.close()
            raise TransportError(f"the engine refused the connection: {msg.reason}")
        if not isinstance(msg, Welcome):
            self.close()
            raise TransportError("the engine did not answer the handshake")
        return msg

    def send(self, msg: Message) -> None:
        """Send one message (blocking; commands are tiny); raise TransportError when the engine has
        gone, ProtocolError (a ValueError, nothing sent) for a value no message may carry (a NaN)."""
        if self.sock is None:
            raise TransportError("not connected")
        frame = wire.encode(msg)
        with self._send_lock:
            try:
                self.sock.sendall(frame)
            except OSError as exc:
                raise TransportError(f"connection to the engine lost: {exc.strerror or exc}") from None

    def recv(self, timeout: float | None = None) -> Message | None:
        """The next message, None on timeout; raise TransportError when the engine has gone."""
        if self.sock is None:
            raise TransportError("not connected")
        while not self._pending:
            self.sock.settimeout(timeout)
            try:
                data = self.sock.recv(262144)
            except socket.timeout:
                return None
            except OSError as exc:
                raise TransportError(f"connection to the engine lost: {exc}") from None
            if not data:
                raise TransportError("the engine closed the connection")
            self._pending.extend(self._reader.feed(data))
        return wire.decode(self._pending.pop(0))

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            finally:
                self.sock = None
