"""The authenticated link on real sockets: a round trip, peers without the key, forged,
replayed, reordered and oversized frames, garbage and a flood of half-open connections
(a seeded fuzz); after each, the listener still serves a peer that holds the key."""

from __future__ import annotations

import os
import random
import socket
import threading
import time

import pytest

from ptdash.shared import authlink
from ptdash.shared import linkport
from ptdash.shared.authlink import MAGIC, NONCE, TAG, Channel, LinkRefused, dial
from ptdash.shared.linkport import Listener

KEY = bytes.fromhex("11" * 32)
OTHER = bytes.fromhex("22" * 32)
SEED = 31
CASES = 300


class Echo:
    """A listener on 127.0.0.1 that sends every frame back."""

    def __init__(self, key: bytes = KEY, max_frame: int = 1 << 16) -> None:
        self.served = 0
        self.listener = Listener("127.0.0.1", 0, key, self._echo, max_frame=max_frame)
        self.host, self.port = self.listener.address

    def _echo(self, channel: Channel) -> None:
        self.served += 1
        while (payload := channel.recv()) is not None:
            channel.send(payload)

    def works(self) -> bool:
        channel = dial(self.host, self.port, KEY)
        try:
            channel.send(b"still here")
            return channel.recv() == b"still here"
        finally:
            channel.close()


@pytest.fixture
def echo():
    server = Echo()
    yield server
    server.listener.close()


def pair(key_client: bytes = KEY, key_server: bytes = KEY) -> tuple[Channel, Channel]:
    """(client, server) channels over a socketpair, past the handshake."""
    a, b = socket.socketpair()
    out: dict = {}

    def serve():
        try:
            out["server"] = authlink.server_handshake(b, key_server)
        except LinkRefused as exc:
            out["error"] = exc
            b.close()  # as the listener does: the client must not wait for a proof
    thread = threading.Thread(target=serve)
    thread.start()
    try:
        client = authlink.client_handshake(a, key_client)
    finally:
        thread.join()
    if "error" in out:
        raise out["error"]
    return client, out["server"]


def test_frames_go_both_ways_in_order(echo):
    channel = dial(echo.host, echo.port, KEY)
    for payload in (b"", b"x", os.urandom(60000), b"\0" * 7):
        channel.send(payload)
        assert channel.recv() == payload
    channel.close()


def test_a_peer_without_the_key_is_refused_and_never_gets_the_servers_proof(echo):
    with pytest.raises(LinkRefused, match="closed the connection during the handshake"):
        dial(echo.host, echo.port, OTHER)
    assert echo.listener.refused == 1 and "does not hold this job's key" in echo.listener.last_refusal
    assert echo.served == 0 and echo.works()


def test_a_server_without_the_key_is_refused_by_the_client():
    with pytest.raises(LinkRefused):
        pair(key_client=KEY, key_server=OTHER)
    # the client proves first: a fake server must still fail to prove itself to a real client
    a, b = socket.socketpair()
    b.sendall(MAGIC + os.urandom(NONCE))

    def fake_server():
        b.recv(len(MAGIC) + NONCE + TAG)
        b.sendall(os.urandom(TAG))
    thread = threading.Thread(target=fake_server)
    thread.start()
    with pytest.raises(LinkRefused, match="server does not hold"):
        authlink.client_handshake(a, KEY)
    thread.join()


def test_a_proof_reflected_back_fails(echo):
    # A peer that sends the server's own nonce back as its nonce, with anything as its proof,
    # cannot use the server's proof (it comes only after the client's, and has another label).
    sock = socket.create_connection((echo.host, echo.port))
    hello = sock.recv(len(MAGIC) + NONCE)
    sock.sendall(MAGIC + hello[len(MAGIC):] + authlink.mac(OTHER, b"server", hello[len(MAGIC):], hello[len(MAGIC):]))
    assert sock.recv(64) == b""
    sock.close()
    assert "does not hold" in echo.listener.last_refusal


def _raw_frames(channel: Channel, payloads: list[bytes]) -> bytes:
    """What ``channel`` puts on the wire for ``payloads`` (read from a socketpair)."""
    a, b = socket.socketpair()
    real, channel.sock = channel.sock, a
    try:
        for p in payloads:
            channel.send(p)
        a.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := b.recv(65536):
            data += chunk
        return data
    finally:
        channel.sock = real
        a.close()
        b.close()


def _receiver(server: Channel, data: bytes) -> Channel:
    """A fresh copy of ``server``'s receiving end (its sequence at 0) that reads ``data``."""
    feed, sock = socket.socketpair()
    feed.sendall(data)
    feed.close()
    return Channel(sock, server._send_key, server._recv_key, server.max_frame, "test")


def test_replayed_reordered_altered_and_foreign_frames_fail_their_mac():
    client, server = pair()
    wire = _raw_frames(client, [b"first", b"second"])
    one = 4 + len(b"first") + TAG
    first, second = wire[:one], wire[one:]
    intact = _receiver(server, first + second)
    assert (intact.recv(), intact.recv(), intact.recv()) == (b"first", b"second", None)
    replayed = _receiver(server, first + first)
    assert replayed.recv() == b"first"
    with pytest.raises(LinkRefused, match="frame 1 fails its MAC"):
        replayed.recv()
    with pytest.raises(LinkRefused, match="frame 0 fails its MAC"):
        _receiver(server, second + first).recv()
    for i in range(len(first)):  # every bit of the length, payload and tag counts
        altered = bytearray(first)
        altered[i] ^= 1 << (i % 8)
        with pytest.raises(LinkRefused):
            _receiver(server, bytes(altered)).recv()
    _, other = pair()  # a frame recorded from another connection
    with pytest.raises(LinkRefused, match="frame 0 fails its MAC"):
        _receiver(other, first).recv()


def test_an_oversized_length_is_refused_before_its_payload_is_read():
    client, server = pair()
    server.max_frame = 1000
    client.sock.sendall((1001).to_bytes(4, "big"))  # and no payload: the refusal must not wait for it
    with pytest.raises(LinkRefused, match="1001 bytes is larger than 1000"):
        server.recv()
    with pytest.raises(ValueError):
        Channel(client.sock, KEY, KEY, 10, "x").send(b"y" * 11)


def test_a_frame_cut_short_is_refused():
    client, server = pair()
    data = _raw_frames(client, [b"payload"])
    client.sock.sendall(data[:-3])
    client.sock.shutdown(socket.SHUT_WR)
    with pytest.raises(LinkRefused, match="ended inside a frame"):
        server.recv()


def test_seeded_garbage_and_broken_handshakes_never_stop_the_listener(echo):
    rng = random.Random(SEED)
    for case in range(CASES):
        sock = socket.create_connection((echo.host, echo.port))
        kind = case % 5
        try:
            if kind == 0:  # random bytes at once
                sock.sendall(rng.randbytes(rng.randrange(0, 200)))
            elif kind == 1:  # the right magic, a random proof
                sock.recv(len(MAGIC) + NONCE)
                sock.sendall(MAGIC + rng.randbytes(NONCE + TAG))
            elif kind == 2:  # a short answer, then close
                sock.recv(len(MAGIC) + NONCE)
                sock.sendall(MAGIC + rng.randbytes(rng.randrange(0, NONCE)))
            elif kind == 3:  # an HTTP request
                sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            else:  # past a real handshake, then garbage frames
                authlink.client_handshake(sock, KEY)
                sock.sendall(rng.randbytes(rng.randrange(1, 300)))
            sock.shutdown(socket.SHUT_WR)
            sock.settimeout(10)
            while sock.recv(4096):
                pass  # the listener ends every such connection
        except OSError:
            pass
        finally:
            sock.close()
    assert echo.works()
    assert echo.listener.refused >= CASES * 4 // 5


def _idle(host: str, port: int, source: str = "127.0.0.1") -> socket.socket:
    """A connection that takes the server's nonce and never answers."""
    sock = socket.create_connection((host, port), source_address=(source, 0))
    sock.settimeout(30)
    assert len(sock.recv(len(MAGIC) + NONCE)) == len(MAGIC) + NONCE
    return sock


def _closed(sock: socket.socket) -> bool:
    """Whether the server closed ``sock`` (waiting for it as long as it takes)."""
    try:
        return sock.recv(64) == b""
    except socket.timeout:
        return False
    except OSError:  # reset
        return True


def _wait(condition, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_a_flood_of_idle_connections_never_keeps_a_real_peer_out(echo, monkeypatch):
    """Past the cap of one address, the oldest pending connection is closed and the new one
    served: a real peer gets in while the flood holds every place, and the flood's oldest
    connections are the ones that go."""
    monkeypatch.setattr(linkport, "FIRST_BYTES_SECONDS", 600.0)  # the flood stays as long as the test needs
    cap = linkport.MAX_PER_ADDRESS
    flood: list[socket.socket] = []
    try:
        for _ in range(3):  # a sustained flood: it fills every place again before each dial
            flood += [_idle(echo.host, echo.port) for _ in range(cap - echo.listener.pending)]
            _wait(lambda: echo.listener.pending == cap, "the flood to hold every place of its address")
            oldest = flood[-cap]
            assert echo.works()  # the dial closed the oldest idle connection and got in
            assert _closed(oldest)
            assert "closed in its handshake for a newer connection" in echo.listener.last_refusal
            assert echo.listener.pending == cap - 1
    finally:
        for sock in flood:
            sock.close()


def test_another_addresses_flood_never_takes_this_ones_places(echo, monkeypatch):
    monkeypatch.setattr(linkport, "FIRST_BYTES_SECONDS", 600.0)
    flood = [_idle(echo.host, echo.port, "127.0.0.2") for _ in range(linkport.MAX_PER_ADDRESS + 10)]
    mine = [_idle(echo.host, echo.port) for _ in range(4)]
    try:
        _wait(lambda: echo.listener.pending == linkport.MAX_PER_ADDRESS + 4, "both floods pending")
        for sock in flood[:10]:
            assert _closed(sock)  # its own oldest made room for it
        mine[0].setblocking(False)
        with pytest.raises(BlockingIOError):
            mine[0].recv(64)  # this address's are all still pending
    finally:
        for sock in flood + mine:
            sock.close()


def test_a_connection_that_sends_no_proof_is_closed_after_the_first_bytes_limit(echo):
    sock = _idle(echo.host, echo.port)
    try:
        assert _closed(sock)
        assert f"no proof of the key within {linkport.FIRST_BYTES_SECONDS:g} s" in echo.listener.last_refusal
        assert echo.works()
    finally:
        sock.close()
