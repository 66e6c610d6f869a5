"""The control socket: a Unix socket server in the engine and the client the dashboard uses.

Only the run's owner gets in. The socket lives in a private per-user directory (0700,
checked, never on a network file system), the socket file is 0600, the peer's uid is
checked with SO_PEERCRED before a byte is read, and the first frame must carry the run's
secret token. Frames are length-capped; anything malformed is refused with a reason and
the connection closed, never raising into the engine.

The server never blocks its callers: ``publish`` appends to per-client buffers. A client
that does not read loses live metrics (counted, sent later as ``dropped``) but never
slows training; one whose buffer of must-deliver messages overflows is disconnected.
What all clients together may cost is bounded too: at most MAX_CLIENTS connections and
TOTAL_BUFFER unsent bytes; beyond that a new dashboard is refused with the reason. A client
whose socket took nothing for STALL_SECONDS is dropped, and ``ptdash ctl`` has seats of its
own, so dashboards that stopped reading never lock the owner out (seats.py). Notes
about refusals go to engine.log through a Throttle, so a flood of them costs a few lines.
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
from dataclasses import replace
from pathlib import Path
from typing import Callable

from . import wire
from .private import check_private_dir, peer_uid
from .protocol import Command, Hello, Layers, Message, Metrics, ProtocolError, Refused, Samples, Welcome
from .seats import CTL_SEATS, STALL_SECONDS, Seat, printable, refusal
from .throttle import Throttle

log = logging.getLogger("ptdash.shared.transport")

AUTH_TIMEOUT = 5.0
"""Seconds a new connection has to present its token."""

METRICS_BUFFER = 4 * 1024 * 1024
"""Bytes of unsent frames above which a client's live metrics are dropped."""

HARD_BUFFER = 32 * 1024 * 1024
"""Bytes of unsent frames above which a client is disconnected."""

MAX_CLIENT_FRAME = 64 * 1024
"""Clients only send small commands; a larger frame from one is refused."""

MAX_CLIENTS = 32
"""Connections served at once (dashboards, peers still saying hello); ``ptdash ctl`` has
CTL_SEATS more of its own (seats.py)."""

TOTAL_BUFFER = 64 * 1024 * 1024
"""Unsent bytes across every client. Live metrics get at most half of it, shared among
the clients; above half, new clients are refused; above all of it, the client holding
the most is disconnected."""


# --------------------------------------------------------------------------- server


class Server:
    """Serves one run's control socket from a background thread.

    ``on_command(cmd)`` runs on the server thread for each valid command from an
    authenticated client; ``on_connect()`` returns the messages a new client gets after
    the Welcome (current status and the like); ``on_drop("warning", note)`` hears of a
    client dropped for not reading.
    """

    def __init__(self, path: Path, token: str, welcome: Welcome,
                 on_command: Callable[[Command], None],
                 on_connect: Callable[[], list[Message]] = lambda: [],
                 on_drop: Callable[[str, str], object] = lambda kind, note: None) -> None:
        self.path = Path(path)
        self._token = token
        self._welcome = welcome
        self._on_command = on_command
        self._on_connect = on_connect
        self._on_drop = on_drop
        """Told (on the server thread) of a client dropped because it stopped reading, as the
        journal's ``event(kind, message)`` is: kind ``warning``."""
        self._clients: dict[int, Seat] = {}
        self._lock = threading.Lock()
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.refusals: list[str] = []
        """The latest notes (up to 100), every one of them, logged or not."""
        self._throttle = Throttle()

    def start(self) -> None:
        """Bind the socket (0600) and start serving."""
        check_private_dir(self.path.parent)
        if self.path.exists():
            self.path.unlink()
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            self._listener.bind(str(self.path))
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        self._listener.listen(64)
        self._listener.setblocking(False)
        self._selector.register(self._listener, selectors.EVENT_READ, "listen")
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._thread = threading.Thread(target=self._serve, name="ptdash-server", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Flush what can be flushed in a moment, close every connection, remove the socket."""
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            with self._lock:
                if not any(c.out for c in self._clients.values() if c.authed):
                    break
            time.sleep(0.02)
        self._stopping = True
        self._wake()
        if self._thread is not None:
            self._thread.join(timeout=2)
        if self._thread is None:
            self._wake_r.close()
            self._selector.close()
        if self._thread is None or not self._thread.is_alive():
            self._wake_w.close()
        if self._throttle.held:
            log.warning("%d more notes about clients were not logged", self._throttle.held)
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass

    @property
    def client_count(self) -> int:
        with self._lock:
            return sum(1 for c in self._clients.values() if c.authed)

    def publish(self, msg: Message) -> None:
        """Queue ``msg`` for every authenticated client; never blocks, never raises.

        Live samples (metrics and per-layer statistics) are dropped for a client whose
        buffer is full (METRICS_BUFFER, or its share of half of TOTAL_BUFFER), metrics
        rows counted; other messages (parameter names among them) are always queued, up
        to HARD_BUFFER for one client and TOTAL_BUFFER for all, which disconnect it.
        """
        if not any(c.authed and not c.closing for c in list(self._clients.values())):
            return  # nobody to send to (a headless run, a detached dashboard): not even encoded
        try:
            frame = wire.encode(msg)
        except ProtocolError as exc:  # only a frame above MAX_FRAME: a bug, never a reason to fail
            self._note(f"not sent: {exc}")
            return
        is_metrics = isinstance(msg, Metrics)
        droppable = is_metrics or isinstance(msg, (Layers, Samples))
        with self._lock:
            served = [c for c in self._clients.values() if c.authed and not c.closing]
            share = min(METRICS_BUFFER, TOTAL_BUFFER // (2 * max(1, len(served))))
            for client in served:
                if droppable and len(client.out) > share:
                    client.dropped += len(msg.rows) if is_metrics else 0
                    continue
                if is_metrics and client.dropped:
                    client.out += wire.encode(replace(msg, dropped=msg.dropped + client.dropped))
                    client.dropped = 0
                else:
                    client.out += frame
                if len(client.out) > HARD_BUFFER:
                    client.closing = True
                    self._note(f"client {client.name} disconnected: it stopped reading")
            if not droppable and sum(len(c.out) for c in served) > TOTAL_BUFFER:
                greediest = max(served, key=lambda c: len(c.out))
                self._note(f"client {greediest.name} disconnected: the engine's send buffers are full "
                           f"and it holds the most ({len(greediest.out) // 1024} KiB)")
                greediest.closing = True
                greediest.out.clear()  # it is not reading: what it holds would never leave
        self._wake()

    def buffered(self) -> int:
        """Bytes queued for every client and not yet sent."""
        with self._lock:
            return sum(len(c.out) for c in self._clients.values())

    # The serving loop and its helpers run on the server thread only.

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except (BlockingIOError, OSError):
            pass

    def _note(self, reason: str) -> None:
        reason = printable(reason)
        self.refusals.append(reason)
        del self.refusals[:-100]
        allowed, held = self._throttle.allow()
        if allowed:
            log.warning("%s%s", reason, f" ({held} similar notes before this one were not logged)" if held else "")

    def _serve(self) -> None:
        try:
            while not self._stopping:
                for key, events in self._selector.select(timeout=0.5):
                    if key.data == "listen":
                        self._accept()
                    elif key.data == "wake":
                        try:
                            while self._wake_r.recv(4096):
                                pass
                        except BlockingIOError:
                            pass
                    else:
                        self._service(key.data, events)
                self._reap()
                self._update_interest()
        except Exception:  # the server must never take the engine down with it
            log.exception("control socket server failed")
        finally:
            for client in list(self._clients.values()):
                self._close(client)
            self._listener.close()
            self._selector.close()
            self._wake_r.close()

    def _service(self, client: Seat, events: int) -> None:
        """Read and write one client; whatever goes wrong with it ends only that client."""
        try:
            if events & selectors.EVENT_READ:
                self._read(client)
            if events & selectors.EVENT_WRITE and client.sock.fileno() >= 0:
                self._write(client)
        except Exception:
            log.exception("client %s failed; disconnected", client.name)
            self._close(client)

    def _accept(self) -> None:
        try:
            sock, _ = self._listener.accept()
        except (BlockingIOError, OSError):
            return
        try:
            uid = peer_uid(sock)
        except OSError as exc:
            self._note(f"refused a connection whose peer cannot be identified: {exc}")
            sock.close()
            return
        if uid != os.getuid():
            self._note(f"refused a connection from uid {uid}: only the run's owner may connect")
            self._refuse_now(sock, "only the run's owner may connect")
            return
        with self._lock:
            count = len(self._clients)
        if count >= MAX_CLIENTS + CTL_SEATS:  # a dashboard's or ctl's seat is known at its hello
            reason = f"too many connections ({count}); close another dashboard or ptdash ctl first"
            self._note(f"refused a connection: {reason}")
            self._refuse_now(sock, reason)
            return
        sock.setblocking(False)
        client = Seat(sock, time.monotonic(), MAX_CLIENT_FRAME)
        with self._lock:
            self._clients[client.fd] = client
        self._selector.register(sock, selectors.EVENT_READ, client)

    def _refuse_now(self, sock: socket.socket, reason: str) -> None:
        try:
            sock.setblocking(False)
            sock.send(wire.encode(Refused(reason)))
        except OSError:
            pass
        sock.close()

    def _refuse(self, client: Seat, reason: str) -> None:
        self._note(f"refused client {client.name}: {reason}")
        with self._lock:
            client.out += wire.encode(Refused(reason))
            client.closing = True

    def _read(self, client: Seat) -> None:
        try:
            data = client.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._close(client)
            return
        if client.closing:
            return
        try:
            frames = client.reader.feed(data)
            for payload in frames:
                self._handle(client, wire.decode(payload))
                if client.closing:
                    return
        except ProtocolError as exc:
            self._refuse(client, f"bad frame: {exc}")

    def _handle(self, client: Seat, msg: Message) -> None:
        if not client.authed:
            if not isinstance(msg, Hello):
                self._refuse(client, "the first message must be hello")
            elif not hmac.compare_digest(msg.token.encode("utf-8", "replace"), self._token.encode()):
                self._refuse(client, "wrong token")
            else:
                with self._lock:
                    reason = refusal(list(self._clients.values()), client, msg.client, MAX_CLIENTS,
                                     sum(len(c.out) for c in self._clients.values()), TOTAL_BUFFER // 2)
                if reason:
                    self._note(f"refused a connection: {reason}")
                    with self._lock:
                        client.out += wire.encode(Refused(reason))
                        client.closing = True
                    return
                client.name = printable(msg.client[:32])
                frames = b"".join(wire.encode(m) for m in [self._welcome, *self._on_connect()])
                with self._lock:
                    # Served from here on, under the lock that ``publish`` holds, after its Welcome:
                    # a message published by another thread (a status, a flush's metrics)
                    # between the two reached a new client before its Welcome, which refused it.
                    client.authed = True
                    client.out += frames
            return
        if isinstance(msg, Command):
            try:
                self._on_command(msg)
            except Exception:  # one bad command must not stop the server
                log.exception("command %r failed", msg)
        else:
            self._refuse(client, f"unexpected {msg.type} message")

    def _write(self, client: Seat) -> None:
        with self._lock:
            data = bytes(client.out[:262144])
        if data:
            try:
                sent = client.sock.send(data)
            except BlockingIOError:
                return
            except OSError:
                self._close(client)
                return
            with self._lock:
                del client.out[:sent]
            client.took(sent)
        if client.closing and not client.out:
            self._close(client)

    def _reap(self) -> None:
        now = time.monotonic()
        for client in list(self._clients.values()):
            if not client.authed and not client.closing and now - client.connected_at > AUTH_TIMEOUT:
                self._refuse(client, "no hello within the time limit")
            with self._lock:
                stalled, unsent = client.stalled(now, STALL_SECONDS), len(client.out)
            if stalled:
                note = (f"client {client.name} disconnected: it read nothing for {STALL_SECONDS:g} s "
                        f"({unsent // 1024} KiB waited for it)")
                self._note(note)
                self._close(client)
                try:
                    self._on_drop("warning", note)
                except Exception:  # noqa: BLE001 - a note must not stop the server
                    log.exception("journaling a dropped client failed")
                continue
            if client.closing and (not client.out or len(client.out) > HARD_BUFFER):
                self._close(client)

    def _update_interest(self) -> None:
        with self._lock:
            clients = list(self._clients.values())
        for client in clients:
            want = selectors.EVENT_READ | (selectors.EVENT_WRITE if client.out else 0)
            try:
                if self._selector.get_key(client.sock).events != want:
                    self._selector.modify(client.sock, want, client)
            except (KeyError, ValueError):
                pass

    def _close(self, client: Seat) -> None:
        with self._lock:
            self._clients.pop(client.fd, None)
        try:
            self._selector.unregister(client.sock)
        except (KeyError, ValueError):
            pass
        client.sock.close()
