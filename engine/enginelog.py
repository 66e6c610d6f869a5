"""engine.log: where every part of the engine logs, in the run dir, never the script's output.

Set up once per process by the bootstrap (the main process) and by a rank's start-up
(every other rank), before anything logs.
"""

from __future__ import annotations

import logging
from pathlib import Path

from .shared import perms


class QuietFileHandler(logging.FileHandler):
    """engine.log's handler: a record it cannot write (a full disk) is counted and dropped.

    logging's own handler prints a traceback to stderr instead, which is the script's
    output stream here.
    """

    dropped = 0

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        QuietFileHandler.dropped += 1


def setup_logging(run_dir: Path) -> None:
    """Send the ``ptdash`` loggers to ``run_dir/engine.log`` (created with the run's file mode)."""
    path = run_dir / "engine.log"
    perms.touch(path)  # the run's file mode, not the umask's
    # What a peer sent can reach a log line: an unencodable character must not fail it.
    handler = QuietFileHandler(path, errors="backslashreplace")  # a full disk drops records quietly
    handler.setFormatter(logging.Formatter("%(asctime)s %(threadName)s %(name)s %(levelname)s %(message)s"))
    logger = logging.getLogger("ptdash")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
