"""Metrics rows travel as packed columns (shared/packed.py): every row comes back as it was
sent, non-finite values as None, and a damaged packing is refused in one line."""

from __future__ import annotations

import base64
import json
import math
import random

import pytest

from ptdash.shared import packed
from ptdash.shared.protocol import Metrics, ProtocolError
from ptdash.shared.wire import decode, encode


def _round_trip(rows: list, **fields) -> Metrics:
    frame = encode(Metrics(rows=rows, **fields))
    return decode(frame[4:])


def test_a_flush_of_rows_comes_back_as_sent():
    rng = random.Random(0)
    rows = []
    for step in range(1, 301):
        values = {"loss": rng.random() * 10, "opt/lr/group0": 3e-4, "time/step_s": rng.random() / 100}
        if step % 16 == 0:  # a sampled step: more names, in another order
            values = {"grad/norm_total": rng.random(), **values, "time/data_s": 1e-5}
        if step == 77:
            values["loss"] = None  # non-finite at the source
        rows.append([step, 1.8e9 + step * 0.00185, values])
    msg = _round_trip(rows, rank=3, dropped=5)
    assert msg.rows == rows
    assert [list(r[2]) for r in msg.rows] == [list(r[2]) for r in rows]  # names in their order
    assert (msg.rank, msg.dropped) == (3, 5)


def test_the_packed_frame_is_smaller_than_the_json_rows():
    rows = [[s, 1.8e9 + s / 7, {"loss": 1 / (s + 3), "opt/lr/group0": 1e-3, "time/step_s": s / 1e5}]
            for s in range(200)]
    frame = encode(Metrics(rows=rows))
    plain = json.dumps({"type": "metrics", "v": 2, "rows": rows, "rank": 0, "dropped": 0}, separators=(",", ":"))
    assert "packed" in json.loads(frame[4:]) and len(frame) < 0.7 * len(plain)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, None])
def test_a_non_finite_value_arrives_as_none(value):
    msg = _round_trip([[1, 0.0, {"a": value, "b": 2.0}], [2, 0.5, {"a": 1.0, "b": value}]])
    assert msg.rows == [[1, 0.0, {"a": None, "b": 2.0}], [2, 0.5, {"a": 1.0, "b": None}]]


def test_rows_without_values_and_with_integer_numbers_come_back():
    msg = _round_trip([[1, 0, {}], [2, 1, {"count": 3}], [3, 2, {}]])
    assert msg.rows == [[1, 0.0, {}], [2, 1.0, {"count": 3.0}], [3, 2.0, {}]]


@pytest.mark.parametrize("row", [
    [1, 0.0, {"note": "text"}],  # a value that is not a number
    [2 ** 70, 0.0, {"loss": 1.0}],  # a step beyond 64 bits
])
def test_rows_the_columns_cannot_hold_travel_as_json(row):
    assert packed.pack([row]) is None
    body = json.loads(encode(Metrics(rows=[row]))[4:])
    assert "packed" not in body and body["rows"] == [row]


def _frame(packing: dict | str, **extra) -> bytes:
    return json.dumps({"type": "metrics", "v": 2, "packed": packing, **extra}).encode()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


GOOD = packed.pack([[1, 0.0, {"loss": 1.0}], [2, 0.5, {"loss": 0.5}]])


@pytest.mark.parametrize("damage, said", [
    (lambda p: "not an object", "packed must be an object"),
    (lambda p: {**p, "groups": None}, "packed must be an object"),
    (lambda p: {**p, "steps": 5}, "packed steps must be base64 text"),
    (lambda p: {**p, "walls": "%%%"}, "packed walls is not base64"),
    (lambda p: {**p, "steps": _b64(b"123")}, "not a whole number of 8-byte numbers"),
    (lambda p: {**p, "walls": _b64(b"\0" * 8)}, "2 steps but 1 wall times"),
    (lambda p: {**p, "walls": _b64(b"\0\0\0\0\0\0\xf8\x7f" * 2)}, "a wall time is not a finite number"),
    (lambda p: {**p, "groups": [[2, ["loss"], _b64(b"\0" * 8)]]}, "a group of 2 rows x 1 names holds 1 values"),
    (lambda p: {**p, "groups": [[1, ["loss"], _b64(b"\0" * 8)]]}, "groups hold 1 rows but there are 2 steps"),
    (lambda p: {**p, "groups": [[3, ["loss"], _b64(b"\0" * 24)]]}, "a group of 3 rows x 1 names"),
    (lambda p: {**p, "groups": [["2", ["loss"], ""]]}, "a packed group must be [count, names, values]"),
    (lambda p: {**p, "groups": [[2, [1], ""]]}, "a packed group must be [count, names, values]"),
    (lambda p: {**p, "groups": [[0, [], ""]]}, "a packed group must be [count, names, values]"),
])
def test_a_damaged_packing_is_refused_in_one_line(damage, said):
    with pytest.raises(ProtocolError) as caught:
        decode(_frame(damage(GOOD)))
    message = str(caught.value)
    assert said in message and "\n" not in message and message.startswith("bad metrics message")


def test_rows_and_packed_rows_together_are_refused():
    with pytest.raises(ProtocolError, match="rows and packed rows both given"):
        decode(_frame(GOOD, rows=[]))


def test_random_bytes_in_the_packing_never_raise_anything_else():
    rng = random.Random(1)
    for _ in range(300):
        n = rng.randrange(0, 40)
        junk = {"steps": _b64(rng.randbytes(8 * rng.randrange(0, 4))),
                "walls": _b64(rng.randbytes(8 * rng.randrange(0, 4))),
                "groups": [[rng.randrange(1, 3), ["a", "b"][: rng.randrange(0, 3)], _b64(rng.randbytes(n))]]}
        try:
            msg = decode(_frame(junk))
        except ProtocolError:
            continue
        for step, wall, values in msg.rows:  # what decodes is a well-formed row
            assert type(step) is int and math.isfinite(wall)
            assert all(v is None or math.isfinite(v) for v in values.values())
