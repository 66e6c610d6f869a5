"""A node's launcher says the /proc state of its own ranks to the hub, and of no other process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from ptdash.noderelay import descends, proc_states


def test_only_this_launchers_descendants_are_said_with_their_state():
    # A child that starts a grandchild, both of this process: the ranks under a launcher.
    child = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; subprocess.run([sys.executable, '-c', "
                              "'import sys; sys.stdin.read()'])"], stdin=subprocess.PIPE)
    try:
        grandchild = None
        while grandchild is None:
            found = [int(p) for p in os.listdir("/proc") if p.isdigit() and _parent(int(p)) == child.pid]
            grandchild = found[0] if found else None
            time.sleep(0.01)
        os.kill(grandchild, signal.SIGSTOP)
        while not open(f"/proc/{grandchild}/stat").read().rpartition(")")[2].split()[0] == "T":
            time.sleep(0.01)  # the signal is delivered on its own time
        try:
            assert descends(child.pid, os.getpid()) and descends(grandchild, os.getpid())
            assert not descends(os.getppid(), os.getpid()) and not descends(os.getpid(), os.getpid())
            states = proc_states([child.pid, grandchild, os.getppid(), 1, "7", True, -3], os.getpid())
        finally:
            os.kill(grandchild, signal.SIGCONT)
        assert set(states) == {str(child.pid), str(grandchild)}, states  # nothing of another process
        assert states[str(grandchild)][0] == "T (stopped)" and states[str(child.pid)][0][:1] in ("R", "S")
        assert proc_states("not a list", os.getpid()) == {}
    finally:
        child.kill()
        child.wait()


def _parent(pid: int) -> int | None:
    try:
        return int(open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return None
