"""The authenticated TCP link between nodes: mutual challenge-response on a pre-shared key,
then a MAC on every frame. Stdlib only.

Both ends hold the job's key (linkkey.py: a per-user 0600 file on the shared home, or the
job's environment); it never travels. The handshake, with fixed-size messages:

```
 server -> client   MAGIC | Ns                         (Ns, Nc: 32 random bytes each)
 client -> server   MAGIC | Nc | HMAC(K, "client" | Ns | Nc)
 server -> client            HMAC(K, "server" | Ns | Nc)
```

The client proves it holds the key against the server's fresh nonce; only then does the
server prove it holds the key against the client's, so a peer without the key learns
nothing but a random nonce. The labels keep a proof from being reflected back as the
other side's. Each direction then has its own session key, ``HMAC(K, "c2s"|"s2c" | Ns | Nc)``,
new for every connection.

A frame is a 4-byte big-endian length, that many bytes of payload, and a 32-byte
``HMAC(session key, seq | length | payload)``, ``seq`` counting the frames in that direction
from 0 (it is in the MAC, not on the wire). A frame recorded from another connection, or
replayed, reordered or dropped in this one, fails its MAC; so does any change to it.
A length above the channel's limit is refused before a byte of the payload is read.
Frames are authenticated, not encrypted: what travels (metrics, commands, the script's
output) is not secret, the key is, and it never travels.

Anything wrong ends the connection with ``LinkRefused`` (the reason in one line); the
listener logs it through a Throttle and keeps serving, so garbage, a peer without the
key or a flood of half-open connections cost a few log lines and nothing else.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import socket
import struct
import threading
import time
from typing import Callable

from .throttle import Throttle

log = logging.getLogger("ptdash.shared.authlink")

MAGIC = b"PTDLNK01"
NONCE = 32
TAG = hashlib.sha256().digest_size
_LENGTH = struct.Struct(">I")
_SEQ = struct.Struct(">Q")

HANDSHAKE_TIMEOUT = 5.0
"""Seconds a new connection has to complete the handshake."""

MAX_FRAME = 64 * 1024 * 1024
"""The largest payload a channel accepts unless told otherwise (a rank's largest flush)."""

MAX_HANDSHAKES = 16
"""Connections still in their handshake served at once; more are closed at once."""


class LinkRefused(ConnectionError):
    """The peer failed the handshake or sent a frame that does not check; the reason says how."""


def _mac(key: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, b"".join(parts), hashlib.sha256).digest()


def _read(sock: socket.socket, size: int) -> bytes | None:
    """Exactly ``size`` bytes, or None if the peer closed first."""
    buf = bytearray()
    while len(buf) < size:
        chunk = sock.recv(min(size - len(buf), 1 << 20))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


def _need(sock: socket.socket, size: int, what: str) -> bytes:
    data = _read(sock, size)
    if data is None:
        raise LinkRefused(f"the peer closed the connection during the handshake ({what})")
    return data


class Channel:
    """One authenticated connection: ``send(payload)`` from any thread, ``recv()`` from one."""

    def __init__(self, sock: socket.socket, send_key: bytes, recv_key: bytes, max_frame: int,
                 peer: str) -> None:
        self.sock = sock
        self.peer = peer
        """``host:port`` of the other end, for log lines."""
        self.max_frame = max_frame
        self._send_key, self._recv_key = send_key, recv_key
        self._send_seq = self._recv_seq = 0
        self._send_lock = threading.Lock()

    def send(self, payload: bytes) -> None:
        """Send one frame; raises OSError when the connection is gone."""
        if len(payload) > self.max_frame:
            raise ValueError(f"a frame of {len(payload)} bytes is larger than {self.max_frame}")
        head = _LENGTH.pack(len(payload))
        with self._send_lock:
            tag = _mac(self._send_key, _SEQ.pack(self._send_seq), head, payload)
            self._send_seq += 1
            self.sock.sendall(head + payload + tag)

    def recv(self) -> bytes | None:
        """The next frame's payload; None when the peer closed the connection between frames.
        Raises LinkRefused for a frame that is too large, cut short or fails its MAC."""
        head = _read(self.sock, _LENGTH.size)
        if head is None:
            return None
        (size,) = _LENGTH.unpack(head)
        if size > self.max_frame:
            raise LinkRefused(f"a frame of {size} bytes is larger than {self.max_frame}")
        body = _read(self.sock, size + TAG)
        if body is None:
            raise LinkRefused("the connection ended inside a frame")
        payload, tag = body[:size], body[size:]
        if not hmac.compare_digest(tag, _mac(self._recv_key, _SEQ.pack(self._recv_seq), head, payload)):
            raise LinkRefused(f"frame {self._recv_seq} fails its MAC (altered, replayed or out of order)")
        self._recv_seq += 1
        return payload

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def _session(key: bytes, sn: bytes, cn: bytes) -> tuple[bytes, bytes]:
    """(client-to-server key, server-to-client key) of one connection."""
    return _mac(key, b"c2s", sn, cn), _mac(key, b"s2c", sn, cn)


def client_handshake(sock: socket.socket, key: bytes, max_frame: int = MAX_FRAME,
                     timeout: float | None = None) -> Channel:
    """Authenticate a connected socket as the client; the Channel, or LinkRefused."""
    sock.settimeout(timeout or HANDSHAKE_TIMEOUT)
    peer = _name(sock.getpeername())
    try:
        hello = _need(sock, len(MAGIC) + NONCE, "the server's nonce")
        if hello[:len(MAGIC)] != MAGIC:
            raise LinkRefused("the other end does not speak the ptdash link")
        sn, cn = hello[len(MAGIC):], os.urandom(NONCE)
        sock.sendall(MAGIC + cn + _mac(key, b"client", sn, cn))
        proof = _need(sock, TAG, "the server's proof")
        if not hmac.compare_digest(proof, _mac(key, b"server", sn, cn)):
            raise LinkRefused("the server does not hold this job's key")
    except socket.timeout:
        raise LinkRefused("the handshake timed out") from None
    sock.settimeout(None)
    c2s, s2c = _session(key, sn, cn)
    return Channel(sock, c2s, s2c, max_frame, peer)


def server_handshake(sock: socket.socket, key: bytes, max_frame: int = MAX_FRAME,
                     timeout: float | None = None) -> Channel:
    """Authenticate an accepted socket as the server; the Channel, or LinkRefused."""
    sock.settimeout(timeout or HANDSHAKE_TIMEOUT)
    peer = _name(sock.getpeername())
    sn = os.urandom(NONCE)
    try:
        sock.sendall(MAGIC + sn)
        answer = _need(sock, len(MAGIC) + NONCE + TAG, "the client's proof")
        if answer[:len(MAGIC)] != MAGIC:
            raise LinkRefused("the peer does not speak the ptdash link")
        cn, proof = answer[len(MAGIC):len(MAGIC) + NONCE], answer[len(MAGIC) + NONCE:]
        if not hmac.compare_digest(proof, _mac(key, b"client", sn, cn)):
            raise LinkRefused("the peer does not hold this job's key")
        sock.sendall(_mac(key, b"server", sn, cn))
    except socket.timeout:
        raise LinkRefused("the handshake timed out") from None
    sock.settimeout(None)
    c2s, s2c = _session(key, sn, cn)
    return Channel(sock, s2c, c2s, max_frame, peer)


def dial(host: str, port: int, key: bytes, timeout: float = 10.0, max_frame: int = MAX_FRAME) -> Channel:
    """Connect and authenticate; OSError when nothing answers, LinkRefused when it is not the hub."""
    sock = socket.create_connection((host, port), timeout=timeout)
    try:
        tune(sock)
        return client_handshake(sock, key, max_frame, min(timeout, HANDSHAKE_TIMEOUT))
    except BaseException:
        sock.close()
        raise


KEEPALIVE = (5, 2, 3)
"""TCP keepalive: idle seconds, interval, probes: a peer whose network was cut is given up
after about 11 s of silence, and unacknowledged data after USER_TIMEOUT_MS."""
USER_TIMEOUT_MS = 15000


def tune(sock: socket.socket) -> None:
    """No delay for small frames (the command exchange), and keepalive (Linux names)."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in zip(("TCP_KEEPIDLE", "TCP_KEEPINTVL", "TCP_KEEPCNT"), KEEPALIVE):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
    if hasattr(socket, "TCP_USER_TIMEOUT"):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, USER_TIMEOUT_MS)


def _name(address) -> str:
    if not isinstance(address, tuple) or len(address) < 2:  # a Unix socketpair (tests)
        return "local"
    host, port = address[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Listener:
    """Accepts authenticated peers on one address: ``on_channel(channel)`` runs on a thread of
    its own for each peer past the handshake. Refused peers are counted and logged."""

    def __init__(self, host: str, port: int, key: bytes, on_channel: Callable[[Channel], None],
                 max_frame: int = MAX_FRAME, name: str = "ptdash-link",
                 on_refuse: Callable[[str, str], None] | None = None) -> None:
        self._key, self._on_channel, self._max_frame, self._name = key, on_channel, max_frame, name
        self._on_refuse = on_refuse
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((host, port))
            self._sock.listen(64)
        except OSError:
            self._sock.close()
            raise
        self.address = self._sock.getsockname()[:2]
        self._pending = threading.BoundedSemaphore(MAX_HANDSHAKES)
        self._throttle = Throttle()
        self._closing = False
        self.refused = 0
        """Connections refused so far (handshake failed, bad frames, too many at once)."""
        self.last_refusal: str | None = None
        self._thread = threading.Thread(target=self._accept_loop, name=name, daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        while not self._closing:
            try:
                sock, address = self._sock.accept()
            except OSError:
                if self._closing:
                    return
                time.sleep(0.05)  # out of file descriptors: let the peers in their handshake finish
                continue
            if not self._pending.acquire(blocking=False):
                self.refuse(_name(address), f"more than {MAX_HANDSHAKES} connections in their handshake")
                sock.close()
                continue
            threading.Thread(target=self._serve, args=(sock, address), name=f"{self._name}-peer",
                             daemon=True).start()

    def _serve(self, sock: socket.socket, address) -> None:
        try:
            try:
                tune(sock)
                channel = server_handshake(sock, self._key, self._max_frame)
            finally:
                self._pending.release()
        except (LinkRefused, OSError) as exc:
            self.refuse(_name(address), str(exc) or type(exc).__name__)
            sock.close()
            return
        try:
            self._on_channel(channel)
        except LinkRefused as exc:
            self.refuse(channel.peer, str(exc))
        except Exception:  # noqa: BLE001 - one peer's failure must not stop the listener
            log.exception("link peer %s failed", channel.peer)
        finally:
            channel.close()

    def refuse(self, peer: str, reason: str) -> None:
        """Count and log (throttled) a refused peer."""
        self.refused += 1
        self.last_refusal = f"{peer}: {reason}"
        allowed, held = self._throttle.allow()
        if allowed:
            log.warning("link: refused %s: %s%s", peer, reason,
                        f" ({held} similar refusals before this one were not logged)" if held else "")
        if self._on_refuse is not None:
            try:
                self._on_refuse(peer, reason)
            except Exception:  # noqa: BLE001 - a note must not stop the listener
                log.exception("noting a refusal failed")

    def close(self) -> None:
        self._closing = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
