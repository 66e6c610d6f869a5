"""The terminal told too: a desktop notification (OSC 9 and OSC 777) and the bell.

``sequence`` builds what the dashboard writes to its terminal for an event that needs a
person (the kinds ``--notify`` tells): iTerm2, WezTerm, kitty, Windows Terminal and foot
show OSC 9 (``ESC ] 9 ; text BEL``) as a desktop notification, rxvt-unicode, Konsole and
VTE terminals (GNOME Terminal, Ghostty) OSC 777 (``ESC ] 777 ; notify ; title ; text BEL``);
each ignores the one it does not know. Inside tmux both go through its DCS passthrough
(``ESC P tmux ; ... ESC \\``, every ESC doubled; tmux 3.3 and later pass it on with
``set -g allow-passthrough on``), so a laptop connected over SSH to a tmux on the GPU box
shows them; the bell goes plain, as tmux relays a bell itself. No Textual here: the app
hands ``TerminalTeller`` its driver's ``write``.
"""

from __future__ import annotations

import re

from ptdash.shared.protocol import Status

from .limiter import Call, RateLimiter
from .notices import Notice

BELL = "\a"
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _clean(text: str, limit: int = 200) -> str:
    """One line with no control characters (an ESC or BEL would end the sequence early)."""
    return _CONTROL.sub(" ", text)[:limit].strip()


def passthrough(seq: str) -> str:
    """``seq`` wrapped for tmux's DCS passthrough: tmux hands it to the terminal outside it."""
    return "\x1bPtmux;" + seq.replace("\x1b", "\x1b\x1b") + "\x1b\\"


def sequence(title: str, body: str, in_tmux: bool) -> str:
    """What to write for a notification titled ``title`` saying ``body``: OSC 9, OSC 777, the bell."""
    title, body = _clean(title, 60).replace(";", ","), _clean(body)
    osc9 = f"\x1b]9;{title}: {body}\a"
    osc777 = f"\x1b]777;notify;{title};{body}\a"
    if in_tmux:
        return passthrough(osc9) + passthrough(osc777) + BELL
    return osc9 + osc777 + BELL


class TerminalTeller:
    """Tells the terminal, through ``write`` (the app's driver), what needs a person: the
    notices of ``notices.of_event`` and the run's end, at one a kind a minute (a burst of
    rollbacks is one notification, the rest summed in the next); ``enabled`` turns it off."""

    def __init__(self, *, write, run_name: str, in_tmux: bool, enabled: bool = True,
                 limiter: RateLimiter | None = None) -> None:
        self.write, self.run_name, self.in_tmux, self.enabled = write, run_name, in_tmux, enabled
        self.limiter = limiter or RateLimiter()
        self.told = 0
        """Notifications written so far (tests and the help read it)."""

    def offer(self, notice: Notice | None, now: float) -> None:
        """Tell ``notice`` now, or hold it for its kind's next minute."""
        if notice is None or not self.enabled:
            return
        call = self.limiter.offer(notice, now) if notice.kind != "end" else Call(notice)
        if call is not None:
            self._tell(call)

    def due(self, now: float) -> None:
        """Tell the summed notices whose minute is over."""
        for call in self.limiter.due(now):
            if self.enabled:
                self._tell(call)

    def _tell(self, call: Call) -> None:
        notice = call.notice
        body = notice.message + (f" (and {call.count - 1} more)" if call.count > 1 else "")
        self.write(sequence(f"ptdash {self.run_name}: {TITLES.get(notice.kind, notice.kind)}", body, self.in_tmux))
        self.told += 1


TITLES = {"end": "run ended", "pause": "paused", "rollback": "rolled back", "stall": "stalled",
          "restart": "restarted"}
"""The notification's title by kind."""


def end_notice(status: Status) -> Notice:
    """The notice of a run whose live status just turned ended (finished, stopped, crashed)."""
    code = status.exit_code
    last = status.detail.strip().splitlines()[-1] if status.detail.strip() else ""
    message = f"{status.state} at step {status.step}" + (f" (exit {code})" if code is not None else "") + \
        (f": {last}" if last else "")
    return Notice("end", message, status.step, None, {"state": status.state, "exit_code": code})
