"""Small numeric helpers both halves use: finite values, moving averages, safe JSON.

JSON has no NaN or infinity, so a non-finite value travels and is stored as None. One
exponential moving average serves the engine's running averages (``ema``) and the
dashboard's smoothed lines (``ema_series``). Stdlib only.
"""

from __future__ import annotations

import math
from typing import Any


def finite_or_none(value: float) -> float | None:
    """``value`` if it is a finite number, else None (what JSON and the store can hold)."""
    return value if math.isfinite(value) else None


def ema(previous: float | None, value: float, alpha: float) -> float:
    """One step of an exponential moving average; the first value starts it.

    ``alpha`` (0 < alpha <= 1) is the weight of the new value.
    """
    return value if previous is None else previous + alpha * (value - previous)


def ema_series(values: list[float | None], alpha: float, steps: list[int] | None = None) -> list[float | None]:
    """The exponential moving average along a series (``ema`` at every point).

    None values stay None in the output and leave the average untouched, so one NaN loss
    does not poison the smoothed line. With ``steps``, a point that stands for a gap of
    ``k`` steps (a decimated history) is weighted as ``k`` steps would be:
    ``1 - (1 - alpha) ** k``.
    """
    if not 0 < alpha <= 1:
        raise ValueError(f"alpha must be in (0, 1], got {alpha!r}")
    out: list[float | None] = []
    avg: float | None = None
    prev_step: int | None = None
    keep = 1.0 - alpha
    for i, v in enumerate(values):
        if v is None:
            out.append(None)
            continue
        weight = alpha
        if steps is not None:
            if prev_step is not None and steps[i] - prev_step > 1:
                weight = 1.0 - keep ** (steps[i] - prev_step)
            prev_step = steps[i]
        avg = ema(avg, v, weight)
        out.append(avg)
    return out


def json_safe(value: Any) -> tuple[Any, bool]:
    """``value`` with every non-finite float replaced by None, and whether any was.

    Dicts, lists and tuples are walked; an integer beyond 64 bits (which SQLite cannot
    hold) becomes a float, or None (replaced) past a float's range; anything else JSON cannot hold
    (a path, an exception) becomes its ``str``. The engine stores and sends event data
    through this, so one NaN in an event can never make a flush fail.
    """
    replaced = False

    def walk(v):
        nonlocal replaced
        if v is None or isinstance(v, (bool, str)):
            return v
        if isinstance(v, int):
            if -2 ** 63 <= v < 2 ** 63:
                return v
            if abs(v) < 2 ** 1023:
                return float(v)
            replaced = True
            return None
        if isinstance(v, float):
            if math.isfinite(v):
                return v
            replaced = True
            return None
        if isinstance(v, dict):
            return {str(k): walk(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [walk(x) for x in v]
        return str(v)

    return walk(value), replaced
