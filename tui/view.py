"""How the Overview's charts are looked at: a step range, a cursor, the smoothing and the y scale.

``ChartView`` is plain state the chart keys change (zoom, pan, cursor, smoothing, log);
the chart builders (tabs/overview.py) read it. Every method takes the steps the charts
hold, ``first`` to ``last``, so a view never points outside the data (the cursor may go
on to ``ahead``, the end of the LR schedule ahead). No Textual here.
"""

from __future__ import annotations

from dataclasses import dataclass

SMOOTHING = (0.0, 0.6, 0.9, 0.95, 0.99)
"""EMA weights the smoothing key cycles through (TensorBoard's "smoothing": the weight of the
average so far; 0 is off)."""

SCALES = ("auto", "log", "linear")
"""Y scales the log key cycles through; ``auto`` is each chart's own choice."""

MIN_SPAN = 8
"""The fewest steps a zoomed chart shows."""

CURSOR_MOVES = 100
"""A cursor key moves the cursor 1/CURSOR_MOVES of the steps in view (ten times that with shift)."""


@dataclass
class ChartView:
    """What part of the run the charts show, and how."""

    span: int | None = None
    """Steps in view when zoomed; None shows the whole run."""
    end: int | None = None
    """The last step in view after panning back; None follows the newest step."""
    cursor: int | None = None
    """The step whose values the legends read, None when no cursor is shown."""
    smoothing: float = 0.95
    """EMA weight of the smoothed lines (0: none)."""
    scale: str = "auto"
    """One of SCALES."""
    metric: int = 0
    """Which group of the printed metrics the metrics panel draws (tabs/overview.metric_groups),
    counted on by the ``v`` key (modulo the groups there are)."""
    pinned: str | None = None
    """The series pinned to the Overview from the Metrics tab (``*``), None when none is."""

    @property
    def zoomed(self) -> bool:
        return self.span is not None

    def window(self, first: int, last: int) -> tuple[int, int] | None:
        """The steps in view, ``(lo, hi)``; None when the whole run is shown."""
        if self.span is None:
            return None
        hi = last if self.end is None else min(self.end, last)
        lo = max(first, hi - self.span)
        return lo, max(hi, lo + 1)

    def zoom_in(self, first: int, last: int) -> None:
        """Show half as many steps, around the cursor when there is one, else the newest."""
        lo, hi = self.window(first, last) or (first, last)
        span = max(MIN_SPAN, (hi - lo) // 2)
        if span >= last - first:
            return
        self.span = span
        if self.cursor is not None:
            self._place(min(last, self.cursor + span // 2), last)
        elif self.end is not None:
            self._place(self.end - (hi - lo - span) // 2, last)

    def zoom_out(self, first: int, last: int) -> None:
        """Show twice as many steps; the whole run once that covers it."""
        if self.span is None:
            return
        self.span *= 2
        if self.span >= 0.9 * (last - first):  # the rounding of halving: that is all of it
            self.reset()
        elif self.end is not None:
            self._place(self.end + self.span // 4, last)

    def reset(self) -> None:
        """Back to the whole run."""
        self.span = self.end = None

    def pan(self, direction: int, first: int, last: int) -> None:
        """Move the zoomed range a quarter of its width back (-1) or on (+1)."""
        window = self.window(first, last)
        if window is None:
            return
        lo, hi = window
        self._place(max(hi + direction * max(1, self.span // 4), first + self.span), last)

    def _place(self, end: int, last: int) -> None:
        self.end = None if end >= last else end

    def move_cursor(self, direction: int, first: int, last: int, far: bool = False,
                    ahead: int | None = None) -> None:
        """Show the cursor (at the newest step in view), or move it, up to ``ahead`` (default
        ``last``); a zoomed range follows it while it is on the recorded steps."""
        window = self.window(first, last) or (first, last if ahead is None else ahead)
        if self.cursor is None:
            self.cursor = min(window[1], last)
            return
        step = max(1, (window[1] - window[0]) // CURSOR_MOVES) * (10 if far else 1)
        self.cursor = min(last if ahead is None else max(last, ahead), max(first, self.cursor + direction * step))
        if self.span is not None:
            lo, hi = window
            if self.cursor > hi:
                self._place(self.cursor, last)
            elif self.cursor < lo:
                self._place(self.cursor + self.span, last)

    def hide_cursor(self) -> None:
        self.cursor = None

    def cycle_smoothing(self) -> None:
        """The next, stronger smoothing; after the strongest, none."""
        later = [w for w in SMOOTHING if w > self.smoothing]
        self.smoothing = later[0] if later else SMOOTHING[0]

    def cycle_scale(self) -> None:
        """auto -> log -> linear -> auto."""
        self.scale = SCALES[(SCALES.index(self.scale) + 1) % len(SCALES)]

    def next_metric(self) -> None:
        """The metrics panel's next group of printed metrics."""
        self.metric += 1

    def apply(self, what: str, first: int, last: int, ahead: int | None = None) -> None:
        """Do what a chart key asks over the steps ``first`` to ``last`` (the cursor up to ``ahead``)."""
        {
            "zoom_in": lambda: self.zoom_in(first, last),
            "zoom_out": lambda: self.zoom_out(first, last),
            "reset": self.reset,
            "back": lambda: self.pan(-1, first, last),
            "on": lambda: self.pan(1, first, last),
            "left": lambda: self.move_cursor(-1, first, last, ahead=ahead),
            "right": lambda: self.move_cursor(1, first, last, ahead=ahead),
            "far_left": lambda: self.move_cursor(-1, first, last, far=True, ahead=ahead),
            "far_right": lambda: self.move_cursor(1, first, last, far=True, ahead=ahead),
            "hide": self.hide_cursor,
            "smooth": self.cycle_smoothing,
            "scale": self.cycle_scale,
            "metric": self.next_metric,
        }[what]()

    def can(self, what: str) -> bool:
        """Whether ``what`` would change anything now (the keys that would not are hidden)."""
        if what in ("zoom_out", "reset", "back"):
            return self.zoomed
        if what == "on":
            return self.zoomed and self.end is not None
        if what == "hide":
            return self.cursor is not None
        return True

    def log_y(self, default: bool | str) -> bool | str:
        """The log setting a chart with its own ``default`` gets under this view."""
        return {"log": True, "linear": False}.get(self.scale, default)
