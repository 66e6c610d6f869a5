"""The link between a headless front and its engine: a socketpair the ``ptdash`` command makes.

The front keeps one end and hands the other to the engine (``PTDASH_FRONT_FD``). It does
two jobs that the run dir cannot:

- **the front's death**: when the front goes away without saying ``detach`` (SIGKILL, a
  crash, its job killed), the kernel closes its end and the engine reads end-of-file:
  the run stops cleanly (``EngineLink.watch``). A front whose terminal hangs up (SIGHUP)
  says ``detach`` first, so that run goes on by itself, as a dashboard's does.
- **what the disk could not take**: the script's output that output.log could not be
  written with (a full disk), and ptdash's notices about it, reach the front here.

Frames from the engine: one kind byte (``o`` output, ``n`` notice), a 4-byte big-endian
length, the payload. The engine never waits on the front: frames go through a bounded
buffer drained by a thread of their own; what does not fit is dropped and counted, and a
notice says how much. Stdlib only.
"""

from __future__ import annotations

import collections
import os
import select
import socket
import struct
import threading

ENV = "PTDASH_FRONT_FD"
DETACH = b"detach"
OUTPUT, NOTICE = b"o", b"n"
BUFFER_BYTES = 8 << 20
"""What the engine holds for a front that does not read (stopped, or its stdout blocked)."""
_HEAD = struct.Struct(">cI")


def pair() -> tuple[socket.socket, socket.socket]:
    """(the front's end, the engine's end); hand the second's fd to the engine, then close it."""
    front, engine = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    return front, engine


class EngineLink:
    """The engine's end: frames out through a thread, the front's death in."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.dropped = 0
        """Bytes of output that did not fit the buffer for a front that did not read."""
        self.open = True
        self._queue: collections.deque[bytes] = collections.deque()
        self._queued = 0
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._send_loop, name="ptdash-front", daemon=True)
        self._thread.start()

    @classmethod
    def from_env(cls) -> EngineLink | None:
        """The link the ``ptdash`` command handed this process, if any (taken once: a
        child process the script starts never sees it)."""
        fd = os.environ.pop(ENV, None)
        if not fd:
            return None
        try:
            sock = socket.socket(fileno=int(fd))
            if sock.family != socket.AF_UNIX:
                sock.detach()
                return None
        except (OSError, ValueError):
            return None
        sock.set_inheritable(False)
        return cls(sock)

    def output(self, data: bytes) -> None:
        """Send the script's output (that output.log could not take)."""
        self._put(OUTPUT, data)

    def notice(self, text: str) -> None:
        """Send one of ptdash's plain lines for the front to print."""
        self._put(NOTICE, text.encode("utf-8", "backslashreplace"))

    def _put(self, kind: bytes, data: bytes) -> None:
        if not self.open:
            return
        with self._cond:
            if self._queued + len(data) > BUFFER_BYTES:
                if kind == OUTPUT:
                    self.dropped += len(data)
                return
            self._queue.append(_HEAD.pack(kind, len(data)) + data)
            self._queued += len(data)
            self._cond.notify()

    def _send_loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and self.open:
                    self._cond.wait()
                if not self.open:
                    return
                frame = self._queue.popleft()
                self._queued -= len(frame) - _HEAD.size
            try:
                self.sock.sendall(frame)
            except OSError:  # the front is gone: nothing more goes there
                self.open = False
                return

    def flush(self, timeout: float = 2.0) -> None:
        """Wait (bounded) until what is queued has been handed to the front."""
        with self._cond:
            self._cond.wait_for(lambda: not self._queue or not self.open, timeout)

    def watch(self, timeout: float) -> str | None:
        """Wait up to ``timeout`` s for word from the front: ``"lost"`` (it died without
        detaching), ``"detached"``, or None (nothing yet)."""
        try:
            ready, _, _ = select.select([self.sock], [], [], timeout)
            if not ready:
                return None
            data = self.sock.recv(64)
        except (OSError, ValueError):
            return "lost"
        if not data:
            return "lost"
        return "detached" if DETACH in data else None

    def close(self) -> None:
        self.flush()
        with self._cond:
            self.open = False
            self._cond.notify_all()
        try:
            self.sock.close()
        except OSError:
            pass


class FrontLink:
    """The front's end: reads the engine's frames without ever blocking the front."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        sock.setblocking(False)
        self._buf = b""

    def frames(self) -> list[tuple[bytes, bytes]]:
        """Every whole frame that has arrived: ``[(kind, payload)]``."""
        while True:
            try:
                chunk = self.sock.recv(1 << 16)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                break
            if not chunk:
                break
            self._buf += chunk
        out = []
        while len(self._buf) >= _HEAD.size:
            kind, size = _HEAD.unpack_from(self._buf)
            if len(self._buf) < _HEAD.size + size:
                break
            out.append((kind, self._buf[_HEAD.size:_HEAD.size + size]))
            self._buf = self._buf[_HEAD.size + size:]
        return out

    def detach(self) -> None:
        """Tell the engine that the run goes on without this front."""
        try:
            self.sock.setblocking(True)
            self.sock.sendall(DETACH)
        except OSError:
            pass
