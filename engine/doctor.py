"""The training doctor: live detection of the classic silent PyTorch bugs.

Each rule raises a finding once, with what was seen, why it matters and the fix. The
engine calls the ``on_*`` methods from its hooks; they must stay cheap (no host sync on a
GPU: anything that needs device values is checked at the flush, on the host).
"""

from __future__ import annotations


class Doctor:
    """Receives the engine's hook calls and reports findings through ``engine.event``."""

    def __init__(self, engine) -> None:
        self.engine = engine

    def attach(self) -> None:
        """Install the doctor's own patches (called once, before the script runs)."""

    def detach(self) -> None:
        """Undo ``attach``."""

    def on_backward(self) -> None:
        """A backward pass ran (training thread)."""

    def on_zero_grad(self, owner) -> None:
        """``zero_grad`` was called on an optimizer or module (training thread)."""

    def on_pre_step(self, opt, step: int, params_with_grad: list) -> None:
        """Before the update of step ``step`` of the main optimizer, gradients final."""

    def on_post_step(self, opt, step: int) -> None:
        """After the update of step ``step``."""

    def on_flush(self, rows: list, layer_rows: list) -> None:
        """Host values of the steps since the previous flush (flusher thread)."""

    def on_crash(self, exc: BaseException) -> None:
        """The script raised ``exc``."""
