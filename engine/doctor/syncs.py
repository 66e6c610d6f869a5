"""``host-syncs``: CUDA syncs per source line, counted on two sampled steps (CUDA only)."""

from __future__ import annotations

import threading
from collections import Counter

import torch

from .sources import line_text, remove_filter, user_frame, where

SYNC_TEXT = "synchronizing CUDA operation"
_READ_BACK = (".item(", ".cpu(", ".tolist(", ".numpy(", "print(", "float(", "int(", "bool(", "cpu")


def sync_kind(text: str) -> str:
    """``copy-in`` for a line that looks like a batch copy to the GPU, else ``read-back``.

    A blocking host-to-device copy also waits for the GPU, but moving the batch once a
    step is the norm; the rule is about reading values back (.item(), printing tensors).
    """
    if any(k in text for k in _READ_BACK):
        return "read-back"
    return "copy-in" if (".to(" in text or ".cuda(" in text) else "read-back"


class SyncSampler:
    """Counts the training thread's CUDA syncs per source line on pairs of sampled steps.

    ``torch.cuda.set_sync_debug_mode("warn")`` makes every synchronizing call warn; for
    the two sampled steps those warnings are counted (and kept from the user's stderr),
    then the mode goes back to off. Lines that synced in both steps sync every step. A
    script that sets the mode itself is left alone.
    """

    def __init__(self, first: int = 20, set_mode=None, get_mode=None) -> None:
        self.next_start = first
        self._set_mode = set_mode or torch.cuda.set_sync_debug_mode
        self._get_mode = get_mode or torch.cuda.get_sync_debug_mode
        self.counter: Counter | None = None
        self.windows: list[tuple[int, Counter]] = []
        self.thread: int | None = None
        self._filter = None

    @property
    def active(self) -> bool:
        return self.counter is not None

    def on_post_step(self, step: int) -> dict | None:
        """After step ``step`` (training thread): open or close a window; a finished pair's result."""
        if self.counter is None:
            if step + 1 == self.next_start:
                self._start()
            return None
        self.windows.append((step, self.counter))
        if len(self.windows) < 2:
            self.counter = Counter()
            return None
        self.stop()
        result = self._analyse()
        self.windows = []
        self.next_start *= 10
        return result

    def on_warning(self, message, frame) -> bool:
        """A warning is being shown; True if it is a sampled sync (count it, hide it)."""
        if self.counter is None or SYNC_TEXT not in str(message):
            return False
        if threading.get_ident() == self.thread:
            self.counter[where(user_frame(frame)) or "?"] += 1
        return True

    def _start(self) -> None:
        import warnings

        if self._get_mode() != 0:
            self.next_start = -1  # the script checks its own syncs
            return
        self.thread = threading.get_ident()
        warnings.filterwarnings("always", message=".*" + SYNC_TEXT)
        self._filter = warnings.filters[0]
        self.counter = Counter()
        self._quietly_set("warn")

    def stop(self) -> None:
        """End sampling now: sync debug mode off, our warning filter gone."""
        if self.counter is not None:
            self.counter = None
            self._quietly_set(0)
            remove_filter(self._filter)
            self._filter = None

    def _quietly_set(self, mode) -> None:
        import warnings

        # torch warns that the mode is a prototype: ptdash's doing, not the script's.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Synchronization debug mode")
            self._set_mode(mode)

    def _analyse(self) -> dict | None:
        (a, first), (b, second) = self.windows
        lines = [{"source": s, "text": line_text(s), "per_step": min(first[s], second[s])}
                 for s in first.keys() & second.keys()]
        for line in lines:
            line["kind"] = sync_kind(line["text"])
        lines.sort(key=lambda x: (x["kind"] != "read-back", -x["per_step"], x["source"]))
        read_back = sum(x["per_step"] for x in lines if x["kind"] == "read-back")
        return {"steps": [a, b], "per_step": read_back, "lines": lines} if read_back else None
