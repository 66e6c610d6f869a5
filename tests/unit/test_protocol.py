"""The wire's framing refuses, never breaks: any payload decodes to a message or raises
ProtocolError naming what is wrong, and any message encodes, whatever numbers it holds."""

from __future__ import annotations

import json
import math
import random

import pytest

from ptdash.shared.protocol import Command, Event, Metrics, ProtocolError, Status
from ptdash.shared.wire import decode, encode


def command(value: str) -> bytes:
    return ('{"type":"command","v":2,"id":"x","name":"clip","value":%s}' % value).encode()


@pytest.mark.parametrize("value, shown", [
    ("1e309", "1e309"), ("-1e309", "-1e309"), ("NaN", "NaN"), ("Infinity", "Infinity"),
    ("-Infinity", "-Infinity"), (str(10 ** 400), "(401 characters)"), ("9" * 5000, "(5000 characters)"),
    (str(2 ** 63), str(2 ** 63)), ("1" + "0" * 400 + ".5", "(403 characters)"),
])
def test_numbers_the_protocol_does_not_carry_are_refused_naming_the_field(value, shown):
    with pytest.raises(ProtocolError) as caught:
        decode(command(value))
    message = str(caught.value)
    assert message.startswith("bad command message: value is ") and shown in message
    assert "\n" not in message and len(message) < 200


def test_a_nested_field_is_named_by_its_path():
    payload = b'{"type":"metrics","v":2,"rows":[[1,0.5,{"loss":1.0}],[2,0.5,{"loss":1e999}]]}'
    with pytest.raises(ProtocolError, match=r"rows\[1\]\[2\]\.loss is 1e999"):
        decode(payload)


def test_numbers_within_range_decode_exactly():
    assert decode(command("1.5")) == Command(id="x", name="clip", value=1.5)
    assert decode(command(str(2 ** 63 - 1))).value == 2 ** 63 - 1
    assert decode(command("1e308")).value == 1e308  # finite: the range is validation's job
    status = decode(encode(Status(state="running", step=2 ** 40))[4:])
    assert status.step == 2 ** 40


@pytest.mark.parametrize("payload, reason", [
    (b"\xff\xfe", "not UTF-8 JSON"), (b"{", "not UTF-8 JSON"), (b"[" * 100000, "nested too deeply"),
    (b"[]", "must be a JSON object"), (b'{"type":"command","v":2,"id":"x","name":"clip","value":"abc"}',
                                       "value must be float | None"),
    (b'{"type":"command","v":2,"id":7,"name":"clip"}', "id must be str"),
    (b'{"type":"command","v":2,"name":"clip"}', "bad command message"),
])
def test_malformed_payloads_are_protocol_errors(payload, reason):
    with pytest.raises(ProtocolError, match=reason):
        decode(payload)


def test_random_bytes_only_ever_raise_protocol_errors():
    rng = random.Random(16)
    alphabet = b'{}[]",:0123456789.eE+-NaInfity truefalsnul\\u"\xff\x00type command v 2'
    for _ in range(3000):
        payload = bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
        try:
            decode(payload)
        except ProtocolError:
            pass


def test_every_message_encodes_whatever_numbers_it_holds():
    event = Event(kind="run", step=1, wall=0.0, message="m",
                  data={"nan": math.nan, "inf": [math.inf], "huge": 10 ** 400, "path": object()})
    body = json.loads(encode(event)[4:])
    assert body["data"]["nan"] is None and body["data"]["inf"] == [None] and body["data"]["huge"] is None
    assert body["data"]["path"].startswith("<object")
    rows = decode(encode(Metrics(rows=[[1, 0.0, {"loss": math.nan, "x": 1.0, "y": -math.inf}]]))[4:]).rows
    assert rows == [[1, 0.0, {"loss": None, "x": 1.0, "y": None}]]
    assert decode(encode(Status(state="running", step=1, clip=math.inf))[4:]).clip is None
