"""The start-up hook a run hands down to the script's processes (ptdash/startup), in fresh
interpreters: it wraps init_process_group and nothing else, imports nothing of ptdash
until a process joins a process group, and still runs the user's own sitecustomize."""

from __future__ import annotations

import os
import subprocess
import sys

from ptdash.startup import STARTUP_DIR

PROBE = """
import inspect, sys
import torch
import torch.distributed as dist
f = dist.init_process_group
print("wrapped=", getattr(f, "__ptdash__", False))
print("same signature=", inspect.signature(f) == inspect.signature(getattr(f, "__wrapped__", f)))
print("name=", f.__name__, f.__module__)
print("ptdash imported=", any(m == "ptdash" or m.startswith("ptdash.") for m in sys.modules))
import sitecustomize
print("user site=", getattr(sitecustomize, "USER", None))
"""


def _probe(tmp_path, env: dict) -> dict:
    user = tmp_path / "user-site"
    user.mkdir(exist_ok=True)
    (user / "sitecustomize.py").write_text("USER = 'ran'\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PTDASH_")} | env
    env["PYTHONPATH"] = os.pathsep.join([str(STARTUP_DIR), str(user)])
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return dict(line.split("= ", 1) for line in out.stdout.splitlines() if "= " in line)


def test_in_a_run_init_process_group_is_wrapped_and_nothing_else_happens(tmp_path):
    seen = _probe(tmp_path, {"PTDASH_RUN_DIR": str(tmp_path / "run"), "PTDASH_HUB_PID": "1"})
    assert seen["wrapped"] == "True" and seen["same signature"] == "True"
    assert seen["name"] == "init_process_group torch.distributed.distributed_c10d"
    assert seen["ptdash imported"] == "False"  # a DataLoader worker or helper pays nothing more
    assert seen["user site"] == "ran"  # the user's own sitecustomize, which ours shadows, still runs


def test_outside_a_run_nothing_is_wrapped(tmp_path):
    seen = _probe(tmp_path, {})
    assert seen["wrapped"] == "False" and seen["user site"] == "ran"
