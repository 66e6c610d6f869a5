"""``python -m ptdash.tui.notify RUN_DIR --command CMD``: the notifier process (watcher.py)."""

import sys

from .watcher import main

if __name__ == "__main__":  # imported (as the import hygiene test does), it only defines
    sys.exit(main())
