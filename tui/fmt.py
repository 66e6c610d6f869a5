"""How numbers read on the dashboard: durations, SI and byte sizes, ETAs, command names.

Pure functions of plain values (no Textual, no state), shared by every tab and widget.
"""

from __future__ import annotations

import math


def fmt_duration(seconds: float | None) -> str:
    """``40ms``, ``0.4s``, ``45s``, ``3m05s``, ``1h02m``, ``2d03h``; an em dash when unknown. Under a
    second in ms or tenths: a run of 0.4 s is not one of "0s"."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "—"
    if 0 < seconds < 0.095:
        return f"{seconds * 1000:.0f}ms"
    if 0 < seconds < 0.95:
        return f"{seconds:.1f}s"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m}m{s:02d}s"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h}h{m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d{h:02d}h"


_SI = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def fmt_si(value: float | None, digits: int = 3) -> str:
    """A count or a rate: ``950``, ``12.3k``, ``1.23M``, ``0.0123``, ``3e-4``; N/A for None.

    Large magnitudes get SI prefixes up to T (beyond, an exponent: never ``1e+18T``);
    small ones (below 0.01) a short exponent. For values that are not counts (LRs, losses,
    norms, factors) use ``fmt_num``, which never adds a prefix.
    """
    if value is None:
        return "N/A"
    if not math.isfinite(value):
        return str(value)
    mag = abs(value)
    if mag >= 1e15 * 0.9995:  # beyond the largest prefix: 1e30, not 1e+18T
        return _exponent(value, digits)
    for scale, prefix in _SI:
        if mag >= scale * 0.9995:
            scaled = value / scale  # 1 to 999: enough digits for the integer part (100k, not 1e+02k)
            return f"{scaled:.{max(digits, len(str(int(abs(round(scaled, digits))))))}g}{prefix}"
    if mag >= 1:
        # Never fall into exponent form for the integer digits: 100, not 1e+02.
        return f"{value:.{max(digits, int(math.log10(mag)) + 1)}g}"
    if mag == 0 or mag >= 0.01:
        return f"{value:.{digits}g}"
    return _exponent(value, digits)


def fmt_num(value: float | None, digits: int = 4) -> str:
    """A plain number (an LR, a loss, a norm, a factor): ``0.5321``, ``12.5``, ``3e-4``,
    ``48213``, ``1.2e7``; never an SI prefix (a factor of 1000 is not "1k"). N/A for None."""
    if value is None:
        return "N/A"
    if not math.isfinite(value):
        return str(value)
    mag = abs(value)
    if mag == 0:
        return "0"
    if mag < 0.01 or mag >= 1e6:
        return _exponent(value, digits)
    if mag >= 10 ** (digits - 1):
        return f"{value:.0f}"
    return f"{value:.{digits}g}"


def _exponent(value: float, digits: int) -> str:
    """``3e-4``, ``-4.2e-4``, ``1.5e18``: the short exponent form."""
    mantissa, exponent = f"{value:.{max(0, digits - 1)}e}".split("e")
    if "." in mantissa:
        mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa}e{int(exponent)}"


def fmt_typed(value: float) -> str:
    """``value`` as a person would type it back: the shortest text that reads as the same
    number (``0.5``, ``1``, ``3e-05``), for an input box that starts at the current value."""
    short = f"{value:g}"
    return short if float(short) == value else repr(value)


def fmt_bytes(n: float | None) -> str:
    """``512 B``, ``1.5 KiB``, ``3.2 GiB``; N/A for None."""
    if n is None:
        return "N/A"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def fmt_ms(seconds: float | None) -> str:
    """``12.3 ms``, ``1.25 s``; N/A for None."""
    if seconds is None:
        return "N/A"
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def eta(steps_done: int | None, total: int | None, steps_per_s: float | None) -> float | None:
    """Seconds until ``total`` steps at the current rate; None when it cannot be known."""
    if steps_done is None or not total or not steps_per_s or steps_per_s <= 0:
        return None
    return max(0, total - steps_done) / steps_per_s


def command_text(name: str, value: float | None, typed: str | None = None) -> str:
    """How a command reads in the events pane: ``clip 0.5``, ``LR ×0.5``, ``profile 5 steps``.

    ``typed`` is the value as the person typed it (``1e-4``), shown instead of a rounding.
    """
    shown = typed.strip() if typed else fmt_num(value)
    if name == "clip":
        return "clip off" if value is None else f"clip {shown}"
    if name == "lr_scale":
        return f"LR ×{shown}"
    if name == "profile":
        return f"profile {int(value or 0)} steps"
    return name
