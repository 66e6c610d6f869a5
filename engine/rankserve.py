"""The hub's rank socket: the Unix socket the ranks on its machine connect to.

It sits in the user's private directory (0700, checked), is 0600, and lets in only this
user's processes (SO_PEERCRED) that present the run's token; the kernel names each
peer's pid. A connection past those checks goes to the hub (``serve(conn, hello, pid)``,
on a thread of its own). Ranks on other nodes come through nodeport.py instead.
"""

from __future__ import annotations

import hmac
import logging
import os
import socket
import struct
import threading
from pathlib import Path
from typing import Callable

from . import link
from .shared.private import check_private_dir

log = logging.getLogger("ptdash.hub")


class UnixRankListener:
    """Accepts this user's ranks on ``path``; ``closing()`` says the hub is going away."""

    def __init__(self, path: Path, token: str, serve: Callable[[link.Conn, dict, int], None],
                 closing: Callable[[], bool]) -> None:
        self.path = Path(path)
        self._token, self._serve_rank, self._closing = token, serve, closing
        self._sock: socket.socket | None = None

    def start(self) -> None:
        check_private_dir(self.path.parent)
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            sock.bind(str(self.path))
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        sock.listen(64)
        self._sock = sock
        threading.Thread(target=self._accept_loop, name="ptdash-hub", daemon=True).start()

    def stop(self) -> None:
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._sock.close()
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass

    def _accept_loop(self) -> None:
        while not self._closing():
            try:
                sock, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(sock,), name="ptdash-hub-rank", daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        conn = link.Conn(sock=sock)
        try:
            sock.settimeout(5.0)
            pid, uid = _peer(sock)
            if uid != os.getuid():
                log.warning("rank link: refused a connection from uid %d", uid)
                conn.close()
                return  # another user: not a word
            hello = conn.recv()
            if not hello or not isinstance(hello.get("token"), str) or \
                    not hmac.compare_digest(hello["token"].encode(), self._token.encode()):
                conn.send({"ok": False, "error": "wrong token"})
                conn.close()
                return
        except (OSError, ValueError) as exc:
            log.warning("rank link: a connection failed before its hello: %s", exc)
            conn.close()
            return
        self._serve_rank(conn, hello, pid)


def _peer(conn: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end, from the kernel."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", creds)
    return pid, uid
