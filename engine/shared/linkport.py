"""The listening end of the authenticated link (authlink.py): accepts peers on one address
and runs every handshake from one thread, so that a peer without the key holds nothing
but a socket, for a moment.

A connection that has not proved it holds the key is *pending*. What pending connections
may hold is bounded three ways:

- ``FIRST_BYTES_SECONDS``: the client's proof (its first 72 bytes) must come within 2 s of
  the connection, where a real peer sends it one round trip after connecting;
- ``MAX_PER_ADDRESS`` pending connections from one address, ``MAX_HANDSHAKES`` in all;
- at either cap the *oldest* pending connection is closed and the new one served, so a
  flood of idle connections costs each of its connections its place as soon as anyone
  else arrives, and a real peer gets in while it holds the port; a flood from another
  address never takes a place of this one's.

Each peer past the handshake is served on a thread of its own (``on_channel``). Refused
and closed peers are counted, logged through a Throttle and told to ``on_refuse``.
Stdlib only.
"""

from __future__ import annotations

import hmac
import logging
import os
import selectors
import socket
import threading
import time
from typing import Callable

from .authlink import MAGIC, MAX_FRAME, NONCE, TAG, Channel, LinkRefused, mac, peer_name, session_keys, tune
from .throttle import Throttle

log = logging.getLogger("ptdash.shared.linkport")

FIRST_BYTES_SECONDS = 2.0
"""Seconds a new connection has to send its proof of the key."""

MAX_PER_ADDRESS = 32
"""Pending connections from one address (a node's launcher and two per rank dial at once)."""

MAX_HANDSHAKES = 128
"""Pending connections in all."""

ACCEPT_BURST = 4
"""New connections taken between two looks at the proofs pending ones sent."""

_ANSWER = len(MAGIC) + NONCE + TAG


class _Pending:
    """A connection that has not proved it holds the key yet."""

    __slots__ = ("sock", "host", "peer", "started", "nonce", "got")

    def __init__(self, sock: socket.socket, address, now: float) -> None:
        self.sock = sock
        self.host = address[0] if isinstance(address, tuple) else str(address)
        self.peer = peer_name(address)
        self.started = now
        self.nonce = os.urandom(NONCE)
        self.got = bytearray()


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
            self._sock.listen(128)
        except OSError:
            self._sock.close()
            raise
        self._sock.setblocking(False)
        self.address = self._sock.getsockname()[:2]
        self._pending: dict[int, _Pending] = {}
        """By file descriptor, oldest first (a dict keeps its order of insertion)."""
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._sock, selectors.EVENT_READ)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._throttle = Throttle()
        self._closing = False
        self.refused = 0
        """Connections refused so far (handshake failed, bad frames, closed for a newer one)."""
        self.last_refusal: str | None = None
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    @property
    def pending(self) -> int:
        """Connections in their handshake now."""
        return len(self._pending)

    def _loop(self) -> None:
        try:
            while not self._closing:
                ready = [key for key, _ in self._selector.select(timeout=0.25)]
                # The proofs that came first, then a few new connections: a flood that opens
                # connections as fast as it can then waits for the proofs already sent.
                for key in ready:
                    if key.fileobj is not self._sock and key.fileobj is not self._wake_r:
                        self._progress(key.data)
                if any(key.fileobj is self._sock for key in ready):
                    self._accept()
                self._expire(time.monotonic())
        except Exception:  # noqa: BLE001 - logged; the port is gone, training goes on
            log.exception("the link listener failed")
        finally:
            for pending in list(self._pending.values()):
                self._drop(pending)
            self._selector.close()
            self._wake_r.close()
            self._sock.close()

    def _accept(self) -> None:
        for _ in range(ACCEPT_BURST):  # the selector says when there is more
            try:
                sock, address = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of file descriptors: the pending ones make room as they end
                self._make_room(None, "out of file descriptors")
                time.sleep(0.05)
                return
            self._admit(_Pending(sock, address, time.monotonic()))

    def _make_room(self, host: str | None, why: str) -> None:
        """Close the oldest pending connection from ``host`` (or from anywhere)."""
        same = [p for p in self._pending.values() if host is None or p.host == host]
        if same:
            self.refuse(same[0].peer, f"closed in its handshake for a newer connection ({why})")
            self._drop(same[0])

    def _admit(self, pending: _Pending) -> None:
        if sum(1 for p in self._pending.values() if p.host == pending.host) >= MAX_PER_ADDRESS:
            self._make_room(pending.host, f"{MAX_PER_ADDRESS} pending from {pending.host}")
        elif len(self._pending) >= MAX_HANDSHAKES:
            self._make_room(None, f"{MAX_HANDSHAKES} pending in all")
        try:
            pending.sock.setblocking(False)
            tune(pending.sock)
            if pending.sock.send(MAGIC + pending.nonce) != len(MAGIC) + NONCE:  # an empty buffer takes 40 bytes
                raise OSError("the nonce did not fit in the socket")
        except OSError as exc:
            self.refuse(pending.peer, str(exc) or type(exc).__name__)
            pending.sock.close()
            return
        self._pending[pending.sock.fileno()] = pending
        self._selector.register(pending.sock, selectors.EVENT_READ, pending)

    def _progress(self, pending: _Pending) -> None:
        try:
            data = pending.sock.recv(_ANSWER - len(pending.got))
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            data, why = b"", str(exc)
        else:
            why = "the peer closed the connection during the handshake (the client's proof)"
        if not data:
            self.refuse(pending.peer, why)
            self._drop(pending)
            return
        pending.got += data
        if len(pending.got) < _ANSWER:
            return
        answer = bytes(pending.got)
        cn, proof = answer[len(MAGIC):len(MAGIC) + NONCE], answer[len(MAGIC) + NONCE:]
        if answer[:len(MAGIC)] != MAGIC:
            reason = "the peer does not speak the ptdash link"
        elif not hmac.compare_digest(proof, mac(self._key, b"client", pending.nonce, cn)):
            reason = "the peer does not hold this job's key"
        else:
            self._pass(pending, cn)
            return
        self.refuse(pending.peer, reason)
        self._drop(pending)

    def _pass(self, pending: _Pending, cn: bytes) -> None:
        """The peer proved it holds the key: our proof, then its own thread."""
        self._forget(pending)
        sock = pending.sock
        try:
            sock.settimeout(FIRST_BYTES_SECONDS)
            sock.sendall(mac(self._key, b"server", pending.nonce, cn))
            sock.settimeout(None)
        except OSError as exc:
            self.refuse(pending.peer, str(exc) or type(exc).__name__)
            sock.close()
            return
        c2s, s2c = session_keys(self._key, pending.nonce, cn)
        channel = Channel(sock, s2c, c2s, self._max_frame, pending.peer)
        threading.Thread(target=self._serve, args=(channel,), name=f"{self._name}-peer", daemon=True).start()

    def _expire(self, now: float) -> None:
        for pending in list(self._pending.values()):
            if now - pending.started > FIRST_BYTES_SECONDS:
                self.refuse(pending.peer, f"no proof of the key within {FIRST_BYTES_SECONDS:g} s")
                self._drop(pending)
            else:
                break  # oldest first: the rest are younger

    def _forget(self, pending: _Pending) -> None:
        self._pending.pop(pending.sock.fileno(), None)
        try:
            self._selector.unregister(pending.sock)
        except (KeyError, ValueError):
            pass

    def _drop(self, pending: _Pending) -> None:
        self._forget(pending)
        pending.sock.close()

    def _serve(self, channel: Channel) -> None:
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
            self._wake_w.send(b"\0")
        except OSError:
            pass
        self._thread.join(timeout=2)
        self._wake_w.close()
