"""The terminal's notification: OSC 9 and OSC 777 and the bell, wrapped for tmux, at one a kind a minute."""

from __future__ import annotations

from ptdash.shared.protocol import Status
from ptdash.tui.notify.limiter import RateLimiter
from ptdash.tui.notify.notices import Notice
from ptdash.tui.notify.terminal import TerminalTeller, end_notice, sequence


def test_both_sequences_and_the_bell_and_no_control_character_from_the_message():
    out = sequence("ptdash run: run ended", "crashed\x1b[2J at step 5\x07", in_tmux=False)
    assert out == ("\x1b]9;ptdash run: run ended: crashed [2J at step 5\a"
                   "\x1b]777;notify;ptdash run: run ended;crashed [2J at step 5\a\a")


def test_inside_tmux_each_goes_through_its_passthrough_with_every_escape_doubled():
    out = sequence("t", "b", in_tmux=True)
    assert out == "\x1bPtmux;\x1b\x1b]9;t: b\a\x1b\\" "\x1bPtmux;\x1b\x1b]777;notify;t;b\a\x1b\\" "\a"


def test_a_burst_is_one_notification_then_one_summed_and_the_end_always_goes():
    written = []
    teller = TerminalTeller(write=written.append, run_name="r", in_tmux=False, limiter=RateLimiter(60.0))
    for i, now in enumerate((0.0, 1.0, 2.0)):
        teller.offer(Notice("rollback", f"rolled back {i}", i), now)
    assert len(written) == 1 and "rolled back 0" in written[0]
    teller.due(59.0)
    assert len(written) == 1
    teller.due(61.0)
    assert len(written) == 2 and "rolled back 2 (and 1 more)" in written[1]
    teller.offer(end_notice(Status(state="crashed", step=9, exit_code=1, detail="Traceback\nValueError: x")), 62.0)
    assert "ptdash r: run ended;crashed at step 9 (exit 1): ValueError: x" in written[2]


def test_turned_off_it_writes_nothing():
    written = []
    teller = TerminalTeller(write=written.append, run_name="r", in_tmux=False, enabled=False)
    teller.offer(Notice("stall", "no step for 120 s", 3), 0.0)
    teller.offer(end_notice(Status(state="finished", step=9, exit_code=0)), 1.0)
    assert written == []
