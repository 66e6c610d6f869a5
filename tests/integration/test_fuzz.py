"""A seeded fuzz of the control socket against a real engine running a real tiny script
through the real CLI: random and malformed frames, huge length prefixes, wrong types,
non-finite and out-of-range numbers, never a valid command, over many connections at
once. Afterwards the run is unaffected (running, its settings unchanged, no traceback in
engine.log), every fuzzed command was refused, and the store holds every step.

The case list is fixed by the seed; a time budget only cuts it short on a very slow
machine (the count run is printed), and no assertion depends on how long anything took.
"""

from __future__ import annotations

import json
import random
import socket
import struct
import threading
import time

from ptdash.shared import protocol, rundir, wire
from ptdash.shared.client import Client
from ptdash.shared.protocol import COMMANDS, Ack, Command, Refused, Status, TransportError
from ptdash.shared.reader import StoreReader
from support.runner import SCRIPTS, Run, wait_for

SEED = 16
CASES = 1200
WORKERS = 8
IDLE = 10
"""Connections that say nothing (or only hello) and stay open throughout."""
BUDGET_S = 90.0

NO_VALUE = ("pause", "resume", "checkpoint", "stop", "kill", "stacks")
BAD_NUMBERS = ("NaN", "Infinity", "-Infinity", "1e309", "-1e309", str(10 ** 400), "9" * 5000, str(2 ** 63),
               "-" + str(2 ** 64), "1" + "0" * 400 + ".5")
BAD_TYPES = ('"abc"', "[]", "{}", "true", "false", '{"x":1}', "[1e309]", '"1e308"', '""')
OUT_OF_RANGE = {"lr_scale": ("1e308", "1e-30", "0", "-1", "1001", "1e4"),
                "clip": ("1e7", "1e-30", "-1", "0", "-0.0", "1e300"),
                "profile": ("1e12", "0", "2.5", "-5", "1001", "1000000000000")}


def frame(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


def command_json(rng: random.Random) -> bytes:
    """One command frame's JSON that is never a valid command."""
    name = rng.choice(COMMANDS + ("frobnicate", "PAUSE", "stop ", "", "\\udcff", "kill\\u0000", "x" * 300))
    field = {"type": '"command"', "v": "2", "id": f'"f{rng.randrange(10 ** 6)}"', "name": json.dumps(name)}
    decodable = rng.random() < 0.5  # half reach validation, half are refused at decode
    if name in OUT_OF_RANGE:
        field["value"] = rng.choice(OUT_OF_RANGE[name] if decodable else BAD_NUMBERS + BAD_TYPES)
    elif name in NO_VALUE:
        field["value"] = rng.choice(("1", "0", "1.5", "-1") if decodable else BAD_NUMBERS + BAD_TYPES)
    else:  # an unknown name: invalid whatever the value
        field["value"] = rng.choice(("null", "1") if decodable else BAD_NUMBERS)
    damage = rng.random()
    if damage < 0.1:
        field["id"] = rng.choice(("7", "null", "[]", '"' + "i" * 100 + '"', '""', '"\\udcff"', '"a b\\n"'))
    elif damage < 0.15:
        field["v"] = rng.choice(("1", "3", '"2"', "null", "2.0"))
    elif damage < 0.2:
        del field[rng.choice(("id", "name", "type"))]
    elif damage < 0.25:
        field["name"] = rng.choice(("5", "null", "[]", "{}"))
        field["value"] = "null"  # a valid value: only the name's type is wrong
    elif damage < 0.3:
        field["extra"] = rng.choice(BAD_NUMBERS + BAD_TYPES)
    if field.get("name") in ('"kill"', '"stop"', '"pause"', '"resume"', '"checkpoint"', '"stacks"') and field.get(
            "value") in ("null", None):
        field["value"] = "1"  # never a valid command
    return ("{" + ",".join(f'"{k}":{v}' for k, v in field.items()) + "}").encode()


def junk(rng: random.Random) -> bytes:
    """Bytes that are not a frame of a message: garbage, lies about length, broken JSON."""
    kind = rng.randrange(8)
    if kind == 0:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))
    if kind == 1:  # a huge length prefix, then a little
        return struct.pack(">I", rng.choice((0xFFFFFFFF, 0x7FFFFFFF, 65537, 2 ** 24))) + b"x" * rng.randrange(100)
    if kind == 2:  # a frame cut short
        body = command_json(rng)
        return struct.pack(">I", len(body) + rng.randrange(1, 50)) + body
    if kind == 3:
        return frame(b"[" * rng.randrange(1000, 60000))
    if kind == 4:
        return frame(rng.choice((b"[]", b"null", b"1e309", b'"hello"', b"{}", b'{"type":"nosuch","v":2}',
                                 b'{"type":"status","v":2,"state":"paused","step":1}')))
    if kind == 5:
        return frame(b"\xff\xfe" + command_json(rng))
    if kind == 6:
        return frame(b"")
    return frame(json.dumps({"type": "hello", "v": 2, "token": rng.choice((1, None, [], "0" * 64, "x" * 70000))})
                 .encode()[:60000])


SENTINEL = "fuzz-end"


class Fuzz:
    """Runs the cases from several threads and keeps what came back."""

    def __init__(self, run: Run, rng: random.Random) -> None:
        self.path = run.info().socket
        self.token = rundir.read_token(run.run_dir)
        self.cases = [self._case(rng) for _ in range(CASES)]
        self.lock = threading.Lock()
        self.acks: list[Ack] = []
        self.refusals: list[str] = []
        self.ran = 0
        self.deadline = time.monotonic() + BUDGET_S

    def _case(self, rng: random.Random) -> tuple[bool, list[bytes]]:
        """(say hello first, the frames): most cases speak after a valid hello."""
        if rng.random() < 0.25:
            return False, [junk(rng)]
        return True, [frame(command_json(rng)) if rng.random() < 0.8 else junk(rng)
                      for _ in range(rng.randrange(1, 6))]

    def worker(self, cases: list) -> None:
        for hello, frames in cases:
            if time.monotonic() > self.deadline:
                return
            self._one(hello, frames)
            with self.lock:
                self.ran += 1

    def _one(self, hello: bool, frames: list[bytes]) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(60)
        try:
            sock.connect(self.path)
            if hello:
                sock.sendall(wire.encode(protocol.Hello(token=self.token, client="fuzz")))
            for data in frames:
                sock.sendall(data)
            # Last, a command the engine answers (with a refusal): it answers a connection's
            # frames in order, so once that answer is in, every earlier one has been read,
            # however slow the engine is. A connection it closed instead ends at EOF.
            sock.sendall(wire.encode(Command(id=SENTINEL, name="no-such-command")))
        except OSError:
            pass  # the engine closed on us: what it answered before is still there to read
        try:
            self._collect(sock)
        finally:
            sock.close()

    def _collect(self, sock: socket.socket) -> None:
        """Read every answer, to the sentinel's or to EOF: acks must all be refusals."""
        reader = wire.FrameReader()
        try:
            while chunk := sock.recv(1 << 16):
                for payload in reader.feed(chunk):
                    msg = wire.decode(payload)
                    if isinstance(msg, Ack) and msg.id == SENTINEL:
                        assert not msg.ok, msg
                        return
                    with self.lock:
                        if isinstance(msg, Ack):
                            self.acks.append(msg)
                        elif isinstance(msg, Refused):
                            self.refusals.append(msg.reason)
        except (OSError, protocol.ProtocolError):
            pass


def _connected(path: str, token: str) -> Client | None:
    client = Client(path, token, name="check")
    try:
        client.connect()
    except TransportError as exc:
        assert "too many connections" in str(exc), exc
        return None
    return client


def test_a_fuzzed_socket_leaves_the_run_and_its_store_untouched(tmp_path):
    run = Run(tmp_path, SCRIPTS / "steady.py", "--sleep", "0.01")
    idle = []
    try:
        run.wait_step(3)
        fuzz = Fuzz(run, random.Random(SEED))
        for n in range(IDLE):  # silent peers and clients that never read, open throughout
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(fuzz.path)
            if n % 2:
                sock.sendall(wire.encode(protocol.Hello(token=fuzz.token, client="idle")))
            idle.append(sock)
        before = run.last_step()
        threads = [threading.Thread(target=fuzz.worker, args=(fuzz.cases[i::WORKERS],)) for i in range(WORKERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print(f"fuzz: {fuzz.ran} of {CASES} cases; read {len(fuzz.acks)} acks, {len(fuzz.refusals)} refusals")
        assert fuzz.ran > 0
        assert fuzz.acks and not [a for a in fuzz.acks if a.ok]  # every command refused, none applied
        # Numbers the protocol does not carry are refused at decode, naming the field.
        assert any("value is NaN, not a finite number" in r for r in fuzz.refusals)
        assert any("characters), not a finite number within 64 bits" in r for r in fuzz.refusals)

        # Then a burst of connections past the cap (after the cases, so that none of them is
        # refused for it): those beyond the cap are refused with the reason, never served.
        burst = []
        for _ in range(40):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(fuzz.path)
            burst.append(sock)
        capped = 0
        for sock in burst:
            sock.settimeout(0.5)
            try:
                capped += b"too many connections" in sock.recv(1 << 16)
            except OSError:
                pass  # served: it would wait for a hello, so nothing comes
        assert capped > 0
        for sock in burst + idle:
            sock.close()

        # The run went on and its settings are as they were.
        run.wait_step(before + 20)
        client = wait_for(lambda: _connected(run.info().socket, fuzz.token), 60,
                          what="the server to let the closed connections go")
        status = next(m for m in iter(lambda: client.recv(10), None) if isinstance(m, Status))
        client.close()
        assert (status.state, status.clip, status.lr_scale, status.paused_at) == ("running", None, 1.0, None)
        info = run.info()
        assert (info.status, info.clip, info.lr_scale) == ("running", None, 1.0)
        assert not run.send("lr_scale", 1e308).ok  # still answering, still refusing

        log = (run.run_dir / "engine.log").read_text()
        assert "Traceback" not in log, log[-3000:]
        assert len(log.splitlines()) < fuzz.ran / 4, "refusals were not rate-limited"
        assert "Logging error" not in run.output()

        ack = run.send("stop")
        assert ack.ok
        assert run.wait(120) == 0
        with StoreReader(run.run_dir / "metrics.db") as store:
            steps, losses = store.series("loss")
            events = store.events()
        assert steps == list(range(1, ack.step + 1))  # every step, none lost to a bad flush
        assert all(v is not None for v in losses)
        assert rundir.read_info(run.run_dir).status == "stopped"
        refused = [e for e in events if e.kind == "command" and e.data.get("ok") is False]
        assert refused and all(e.data.get("id") != ack.id for e in refused)
    finally:
        for sock in idle:
            sock.close()
        run.close()
    wait_for(lambda: run.proc.poll() is not None, 30, what="the CLI to end")
