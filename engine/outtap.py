"""The script's prints read for metrics where ptdash does not own fds 1 and 2.

Under ``ptdash`` the output relay (output.py) reads the pipe that fds 1 and 2 write to. A
rank of the user's own ``torchrun -m ptdash.bootstrap`` (or a plain ``python -m
ptdash.bootstrap``) keeps the fds its launcher gave it: a terminal, torchrun's log files,
a pipe to ``tee``. Putting a pipe there would change what the script sees (``isatty``, so
python's line buffering, tqdm's and a logger's colours) and merge its stderr into its
stdout. So nothing is put there; instead ``sys.stdout.write`` and ``sys.stderr.write``
(``print``, logging, tqdm, the Hugging Face Trainer all write through them) get a thin
wrapper, an attribute of each object as the marks' (outmarks.py), that queues what is
written with the step it was written at: the value is the rank's at its own step, exactly.

Per write: a Python call, the step read, a deque append, what python's own write does
being unchanged. The parse runs on a thread of its own (``ptdash-output-tap``), once each
BATCH_S, never on the training thread. A queue of more than MAX_PENDING bytes not parsed
yet takes no more (the values printed then are not read; training never waits on this).

Not read this way: bytes written to fd 1 or 2 below python (``os.write``, C code, a child
process's output). A forked child (a DataLoader worker) queues nothing.
"""

from __future__ import annotations

import collections
import logging
import os
import sys
import threading

log = logging.getLogger("ptdash.outtap")

OFF = "PTDASH_PARSE_OUTPUT"
"""``PTDASH_PARSE_OUTPUT=0`` in the job's environment: nothing is read this way."""
BATCH_S = 0.1
"""How often the queued writes are parsed."""
MAX_PENDING = 8 << 20
"""Characters queued and not parsed yet beyond which writes are not queued."""

_LIVE: list[OutputTap] = []


def _forked() -> None:
    for tap in _LIVE:
        tap.on = False
    _LIVE.clear()


os.register_at_fork(after_in_child=_forked)


class OutputTap:
    """See the module docstring: ``printed`` (printed.PrintedMetrics) gets what
    ``sys.stdout`` and ``sys.stderr`` are given, each write at ``state.step`` then."""

    def __init__(self, printed, state, streams=None) -> None:
        self.printed = printed
        self._state = state
        self._queue: collections.deque = collections.deque()
        self._queued = self._parsed = 0
        """Characters queued (the writers count) and parsed (the thread): each count has one
        kind of writer, so no update of one is lost to the other's."""
        self.skipped = 0
        """Characters not queued: the parser was MAX_PENDING behind."""
        self._streams: list = []
        self.on = True
        self._stop = threading.Event()
        for stream in streams if streams is not None else (sys.stdout, sys.stderr):
            self._wrap(stream)
        _LIVE.append(self)
        self._thread = threading.Thread(target=self._loop, name="ptdash-output-tap", daemon=True)
        self._thread.start()

    @classmethod
    def start(cls, printed, state, environ=os.environ) -> OutputTap | None:
        """Read ``sys.stdout`` and ``sys.stderr`` for ``printed`` (None: not parsing), unless
        ``PTDASH_PARSE_OUTPUT=0``: your own torchrun's ``--no-parse-output``, which it cannot be given."""
        if printed is None or environ.get(OFF) == "0":
            return None
        return cls(printed, state)

    def _wrap(self, stream) -> None:
        """A ``write`` for ``stream`` that queues its text: an attribute of the object, so
        its type, identity and every other method stay python's."""
        if stream is None or "write" in getattr(stream, "__dict__", {"write": None}):
            return
        real = stream.write
        state, queue, tap = self._state, self._queue, self

        def write(text):
            written = real(text)
            if tap.on and isinstance(text, str):
                if tap._queued - tap._parsed < MAX_PENDING:
                    tap._queued += len(text)
                    queue.append((state.step, text))
                else:
                    tap.skipped += len(text)
            return written

        write.__wrapped__ = real
        try:
            stream.write = write
        except (AttributeError, TypeError):
            return
        self._streams.append(stream)

    def _loop(self) -> None:
        while not self._stop.wait(BATCH_S):
            self._pump()

    def _pump(self) -> None:
        """Parse what was queued: consecutive writes of one step as one piece."""
        queue, pieces, size = self._queue, [], 0
        while queue:
            step, text = queue.popleft()
            size += len(text)
            data = text.encode("utf-8", "surrogateescape")
            if pieces and pieces[-1][0] == step:
                pieces[-1][1].append(data)
            else:
                pieces.append((step, [data]))
        if not pieces:
            return
        self._parsed += size
        self.printed.feed_pieces([(step, b"".join(parts)) for step, parts in pieces])

    def close(self, timeout: float = 5.0) -> None:
        """The streams' own ``write`` back; what was queued parsed, the unfinished line as it stands."""
        self.on = False
        for stream in self._streams:
            try:
                del stream.write
            except AttributeError:
                pass
        self._streams = []
        if self in _LIVE:
            _LIVE.remove(self)
        self._stop.set()
        self._thread.join(timeout)
        self._pump()
        self.printed.finish()
        if self.skipped:
            log.warning("%d characters of the script's output were not read for metrics: the parser was behind",
                        self.skipped)
