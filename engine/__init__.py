"""ptdash: a live terminal dashboard and remote control for PyTorch training.

Run an unmodified script with ``ptdash train.py``. This package is what runs inside the
training process; the small public API below is optional and does nothing when the
script runs without ptdash, so a script can use it and still run under plain ``python``.

Importing ``ptdash`` imports neither torch nor textual.
"""

from __future__ import annotations

from .shared import __version__

__all__ = ["log", "watch", "start_step", "active", "__version__"]


def _engine():
    # The bootstrap registers the engine in sys.modules under this name; importing it
    # here would pull in torch for scripts that run without ptdash.
    import sys

    module = sys.modules.get("ptdash.engine")
    return getattr(module, "ENGINE", None)


def active() -> bool:
    """True when this process runs under ptdash."""
    return _engine() is not None


def log(step: int | None = None, **values) -> None:
    """Record custom scalars (floats or 0-d tensors, kept on device until the next flush).

    ``ptdash.log(acc=0.91, val_loss=loss)`` shows up as ``user/acc`` and
    ``user/val_loss``, at the step in progress, or at ``step`` (an int >= 0) when given.
    Without ptdash this does nothing.
    """
    engine = _engine()
    if engine is not None:
        engine.log(values, step)


def watch(model=None, optimizer=None, scheduler=None, scaler=None) -> None:
    """Name what ptdash should checkpoint and chart instead of discovering it.

    Each argument may be a single object or a list. Without ptdash this does nothing.
    """
    engine = _engine()
    if engine is not None:
        engine.watch(model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler)


def start_step() -> int:
    """The optimizer step this run resumes from (``ptdash --resume``), else 0.

    A script that feeds data by step can start its loop here so a resumed run sees the
    same batches as an uninterrupted one. Without ptdash this returns 0.
    """
    engine = _engine()
    if engine is None:
        return 0
    engine.checkpointer.asked = True
    return engine.start_step
