"""``python -m ptdash.tui.notify RUN_DIR --command CMD``: the notifier process (watcher.py)."""

import sys

from .watcher import main

sys.exit(main())
