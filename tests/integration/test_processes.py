"""Host sampling of real process trees: the engine's DataLoader workers, found cheaply."""

from __future__ import annotations

import subprocess
import sys
import time

from ptdash import system


def test_host_sampler_counts_children():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        host = system.HostSampler(children_every_s=0)
        stats = host.sample()
        assert stats["workers"] == 1 and stats["workers_rss_bytes"] > 0
        assert child.pid in host.pids()
    finally:
        child.kill()
        child.wait()
    assert host.sample()["workers"] == 0


def test_descendants_from_the_kernel_match_a_full_process_scan():
    import psutil

    code = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); "
            "print('up', flush=True); time.sleep(30)")
    kids = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        for k in kids:
            assert k.stdout.readline().strip() == "up"
        time.sleep(0.2)  # the grandchild has been spawned before "up"; let it exec
        me = psutil.Process()
        expected = sorted(c.pid for c in me.children(recursive=True))
        assert len(expected) >= 4  # two children, two grandchildren
        assert sorted(system.descendant_pids(me.pid)) == expected
    finally:
        for k in kids:
            for c in psutil.Process(k.pid).children(recursive=True):
                c.kill()
            k.kill()
            k.wait()


def test_system_import_pulls_in_neither_torch_nor_textual():
    code = ("import sys\nfrom ptdash import system\nsystem.SystemSampler().sample()\n"
            "print(sorted(k for k in ('torch', 'textual') if k in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
