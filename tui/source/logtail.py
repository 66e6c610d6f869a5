"""Following the script's output.log as it grows: ``LogTail``. Plain file reads, no thread of its own."""

from __future__ import annotations

import os
from pathlib import Path

LOG_TAIL_BYTES = 256 * 1024
"""How much of an existing output.log is read back on attach."""


class LogTail:
    """Follows a text file that grows: returns new complete lines on each ``read()``.

    The first read returns the last ``LOG_TAIL_BYTES`` of the file. A carriage return
    (progress bars) keeps only the text after it; a file that shrank is re-read from the start.
    """

    def __init__(self, path: Path, max_bytes: int = LOG_TAIL_BYTES) -> None:
        self.path = Path(path)
        self._offset: int | None = None
        self._partial = b""
        self._max_bytes = max_bytes

    def read(self) -> list[str]:
        """The lines completed since the last read (none when the file is missing)."""
        try:
            size = os.stat(self.path).st_size
        except OSError:
            return []
        if self._offset is None:
            self._offset = max(0, size - self._max_bytes)
            skip_first = self._offset > 0
        else:
            skip_first = False
        if size < self._offset:
            self._offset, self._partial = 0, b""
        if size == self._offset:
            return []
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            data = f.read(size - self._offset)
        self._offset += len(data)
        data = self._partial + data
        *complete, self._partial = data.split(b"\n")
        if skip_first and complete:
            complete = complete[1:]
        return [line.decode("utf-8", "replace").rstrip("\r").rsplit("\r", 1)[-1] for line in complete]
