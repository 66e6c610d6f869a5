"""The control socket's seats: one connection the server holds (``Seat``), and who may
take a seat when the room fills up.

A dashboard that stopped reading (its SSH link died, its terminal was suspended) still
holds its connection; so does every one of its kind. Two rules keep the owner in:

- ``ptdash ctl`` has seats of its own (``CTL_SEATS``) that no dashboard may take, and the
  send buffers that dashboards fill never refuse it: it holds a few hundred bytes for a
  moment;
- a client with bytes waiting that the kernel has taken none of for ``STALL_SECONDS`` (its
  socket buffer full: it reads nothing) is dropped, and the drop journaled.

Stdlib only.
"""

from __future__ import annotations

import socket

from . import wire

CTL = "ctl"
"""The name ``ptdash ctl`` gives in its hello (what a ctl seat is kept for)."""

CTL_SEATS = 8
"""Connections beyond the dashboards' cap kept for ``ptdash ctl``."""

STALL_SECONDS = 20.0
"""Seconds a client's socket may stay full (nothing it was sent read) before it is dropped."""


def printable(text: str) -> str:
    """``text`` safe for a log line: what a peer sent may hold lone surrogates."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class Seat:
    """One connection of the server: its socket, what it was sent and has not taken yet."""

    def __init__(self, sock: socket.socket, now: float, max_frame: int) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        """The key in the server's table (a closed socket no longer knows its number)."""
        self.reader = wire.FrameReader(max_frame)
        self.out = bytearray()
        self.authed = False
        self.closing = False
        self.dropped = 0
        self.connected_at = now
        self.name = "?"
        self.blocked_since: float | None = None
        """Since when bytes wait for it that its socket would not take (None: none wait)."""

    @property
    def is_ctl(self) -> bool:
        return self.authed and self.name == CTL

    def took(self, sent: int) -> None:
        """The kernel took ``sent`` bytes for it: it is reading."""
        if sent:
            self.blocked_since = None

    def stalled(self, now: float, limit: float) -> bool:
        """Whether bytes have waited for it, none taken, for ``limit`` seconds (marks the wait's start)."""
        if not self.authed or self.closing or not self.out:
            self.blocked_since = None
            return False
        if self.blocked_since is None:
            self.blocked_since = now
        return now - self.blocked_since >= limit


def refusal(seats: list[Seat], newcomer: Seat, name: str, max_clients: int, buffered: int,
            buffer_limit: int) -> str | None:
    """Why ``newcomer``, saying hello as ``name``, gets no seat, or None.

    ``ptdash ctl`` takes one of its own seats, else a free seat of the room (many ctl at
    once, as a script's loop sends them); it is refused only when both are full. A
    dashboard is refused when the room's seats (connections not known to be ctl, in their
    hello or served, and the ctl beyond their own seats) reach ``max_clients``, or when
    ``buffered`` unsent bytes reach ``buffer_limit``.
    """
    others = [s for s in seats if s is not newcomer and not s.closing]
    ctl = sum(1 for s in others if s.is_ctl)
    count = len(others) - ctl + max(0, ctl - CTL_SEATS)
    if name == CTL:
        if ctl < CTL_SEATS or count < max_clients:
            return None
        return f"every seat is taken ({ctl} by ptdash ctl, {count - max(0, ctl - CTL_SEATS)} by dashboards)"
    if count >= max_clients:
        return f"too many connections ({count}); close another dashboard or ptdash ctl first"
    if buffered >= buffer_limit:
        return (f"the engine's send buffers are full ({buffered // 2 ** 20} MiB unsent to other clients); "
                "a dashboard that stopped reading (Ctrl-Z?) holds them")
    return None
