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
listener (linkport.py) logs it through a Throttle and keeps serving, so garbage, a peer
without the key or a flood of half-open connections cost a few log lines and nothing else.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import struct
import threading

MAGIC = b"PTDLNK01"
NONCE = 32
TAG = hashlib.sha256().digest_size
_LENGTH = struct.Struct(">I")
_SEQ = struct.Struct(">Q")

HANDSHAKE_TIMEOUT = 5.0
"""Seconds the client's end waits for the server's handshake (the server's end: linkport.py)."""

MAX_FRAME = 64 * 1024 * 1024
"""The largest payload a channel accepts unless told otherwise (a rank's largest flush)."""

class LinkRefused(ConnectionError):
    """The peer failed the handshake or sent a frame that does not check; the reason says how.

    ``transient``: the server closed or did not finish the handshake (a port held by a flood
    of connections closes the oldest of them), so trying again later may get in."""

    def __init__(self, reason: str, transient: bool = False) -> None:
        super().__init__(reason)
        self.transient = transient


def mac(key: bytes, *parts: bytes) -> bytes:
    """HMAC-SHA256 of ``parts`` under ``key``."""
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
        raise LinkRefused(f"the peer closed the connection during the handshake ({what})", transient=True)
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
            tag = mac(self._send_key, _SEQ.pack(self._send_seq), head, payload)
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
        if not hmac.compare_digest(tag, mac(self._recv_key, _SEQ.pack(self._recv_seq), head, payload)):
            raise LinkRefused(f"frame {self._recv_seq} fails its MAC (altered, replayed or out of order)")
        self._recv_seq += 1
        return payload

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def session_keys(key: bytes, sn: bytes, cn: bytes) -> tuple[bytes, bytes]:
    """(client-to-server key, server-to-client key) of one connection."""
    return mac(key, b"c2s", sn, cn), mac(key, b"s2c", sn, cn)


def client_handshake(sock: socket.socket, key: bytes, max_frame: int = MAX_FRAME,
                     timeout: float | None = None) -> Channel:
    """Authenticate a connected socket as the client; the Channel, or LinkRefused."""
    sock.settimeout(timeout or HANDSHAKE_TIMEOUT)
    peer = peer_name(sock.getpeername())
    try:
        hello = _need(sock, len(MAGIC) + NONCE, "the server's nonce")
        if hello[:len(MAGIC)] != MAGIC:
            raise LinkRefused("the other end does not speak the ptdash link")
        sn, cn = hello[len(MAGIC):], os.urandom(NONCE)
        sock.sendall(MAGIC + cn + mac(key, b"client", sn, cn))
        proof = _need(sock, TAG, "the server's proof")
        if not hmac.compare_digest(proof, mac(key, b"server", sn, cn)):
            raise LinkRefused("the server does not hold this job's key")
    except socket.timeout:
        raise LinkRefused("the handshake timed out", transient=True) from None
    sock.settimeout(None)
    c2s, s2c = session_keys(key, sn, cn)
    return Channel(sock, c2s, s2c, max_frame, peer)


def server_handshake(sock: socket.socket, key: bytes, max_frame: int = MAX_FRAME,
                     timeout: float | None = None) -> Channel:
    """Authenticate an accepted socket as the server; the Channel, or LinkRefused."""
    sock.settimeout(timeout or HANDSHAKE_TIMEOUT)
    peer = peer_name(sock.getpeername())
    sn = os.urandom(NONCE)
    try:
        sock.sendall(MAGIC + sn)
        answer = _need(sock, len(MAGIC) + NONCE + TAG, "the client's proof")
        if answer[:len(MAGIC)] != MAGIC:
            raise LinkRefused("the peer does not speak the ptdash link")
        cn, proof = answer[len(MAGIC):len(MAGIC) + NONCE], answer[len(MAGIC) + NONCE:]
        if not hmac.compare_digest(proof, mac(key, b"client", sn, cn)):
            raise LinkRefused("the peer does not hold this job's key")
        sock.sendall(mac(key, b"server", sn, cn))
    except socket.timeout:
        raise LinkRefused("the handshake timed out") from None
    sock.settimeout(None)
    c2s, s2c = session_keys(key, sn, cn)
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


def peer_name(address) -> str:
    """``host:port`` (``[host]:port`` for IPv6) of a socket address, for log lines."""
    if not isinstance(address, tuple) or len(address) < 2:  # a Unix socketpair (tests)
        return "local"
    host, port = address[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
