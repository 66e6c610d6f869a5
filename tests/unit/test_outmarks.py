"""Marks in the script's output (ptdash.outmarks): each byte at the step it was written at,
whatever the relay's delay, and no mark in what the script wrote."""

from __future__ import annotations

import io
import os

from ptdash.outmarks import MARK_LEN, Marks, Splitter, new_prefix
from ptdash.stepstate import StepState

PREFIX = new_prefix()


def mark(kind: bytes, step: int) -> bytes:
    return PREFIX + kind + step.to_bytes(8, "big")


class Reader:
    """A Splitter whose 'step in progress when read' the test sets."""

    def __init__(self) -> None:
        self.now = 0
        self.split = Splitter(PREFIX, lambda: self.now)

    def read(self, data: bytes, now: int) -> list[tuple[int, bytes]]:
        self.now = now
        return self.split.split(data)


def test_bytes_after_an_f_mark_are_at_its_step_however_late_they_are_read():
    r = Reader()
    got = r.read(mark(b"F", 3) + b"val_loss=1\n" + mark(b"T", 4) + mark(b"F", 4) + b"val_loss=2\n", now=9)
    assert got == [(3, b"val_loss=1\n"), (4, b"val_loss=2\n")]


def test_bytes_after_a_t_mark_are_at_the_step_read_at_bounded_by_the_next_mark():
    r = Reader()
    # A worker's line after T(5): at most the step in progress when read (7), or below the next T's step.
    assert r.read(mark(b"T", 5) + b"raw=1\n", now=7) == [(7, b"raw=1\n")]
    assert r.read(mark(b"T", 8) + b"raw=2\n" + mark(b"T", 9) + b"raw=3\n", now=12) == [(8, b"raw=2\n"), (12, b"raw=3\n")]
    assert r.read(b"raw=4\n" + mark(b"F", 12) + b"x\n", now=15) == [(12, b"raw=4\n"), (12, b"x\n")]


def test_no_mark_before_any_output_and_the_script_s_own_bytes_unchanged():
    r = Reader()
    own = b"binary \x00\x1b\x00 bytes \x1b[31mred\x1b[0m\n"
    assert r.read(own, now=2) == [(2, own)]


def test_a_mark_cut_by_a_read_is_held_for_the_next_and_a_lone_prefix_start_is_released():
    r = Reader()
    whole = b"a\n" + mark(b"F", 6) + b"b\n"
    for cut in range(3, 2 + MARK_LEN):
        r = Reader()
        first, second = r.read(whole[:cut], now=6), r.read(whole[cut:], now=6)
        assert b"".join(d for _, d in first + second) == b"a\nb\n" and (second[-1] == (6, b"b\n")), cut
    r = Reader()
    assert r.read(b"tail \x00", now=1) == [(1, b"tail ")]  # it might start a mark
    assert r.split.held == b"\x00" and r.split.release() == [(1, b"\x00")]  # none came: the script's byte


class Out(io.TextIOWrapper):
    """A stream on the pipe, as sys.stdout is under ptdash (unbuffered)."""


def test_marks_written_only_at_steps_with_output_and_a_replaced_stream_wrapped_at_the_next_boundary():
    read, write = os.pipe()
    os.set_blocking(read, False)
    state = StepState()
    out = Out(open(os.dup(write), "wb", buffering=0), write_through=True)
    err = Out(open(os.dup(write), "wb", buffering=0), write_through=True)
    streams = [out, err]
    marks = Marks(write, state, PREFIX, streams=lambda: tuple(streams))
    r = Reader()

    def drain() -> list:
        try:
            return r.read(os.read(read, 1 << 16), state.step)
        except BlockingIOError:
            return []

    def boundary(step: int) -> None:  # as stepend.py does
        if state.out_dirty:
            state.out_mark(step)
        state.step = step

    try:
        for step in range(1, 4):  # nothing printed: nothing written, no mark
            boundary(step)
        assert drain() == [] and not state.out_dirty
        print("val_loss=0.5", file=out)  # at step 3
        err.write("bar\r")
        boundary(4)
        boundary(5)
        print("late", file=out)  # at step 5
        assert drain() == [(3, b"val_loss=0.5\nbar\r"), (5, b"late\n")]
        assert type(out.write).__name__ == "function" and isinstance(out, Out)  # the object stays the script's
        own = Out(open(os.dup(write), "wb", buffering=0), write_through=True)
        own.fileno = lambda: 1
        streams[0] = own  # sys.stdout = a stream of the script's own on fd 1
        print("unseen", file=own)  # at step 5: seen by nobody but the relay
        assert drain() == [(5, b"unseen\n")]
        state.out_dirty = True  # the relay read something
        boundary(6)
        boundary(7)
        print("own=1", file=own)  # wrapped at the boundary of step 6: marked
        boundary(8)
        assert drain() == [(7, b"own=1\n")]
        marks.close()
        assert "write" not in vars(out) and "write" not in vars(own)
        print("after", file=out)
        boundary(9)
        assert drain() == [(9, b"after\n")]  # no mark any more: the step it is read at
    finally:
        for stream in (out, err):
            stream.close()
        os.close(read)
        os.close(write)
