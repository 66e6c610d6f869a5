"""Nothing in a DDP job's TCP store is trusted: a peer that rewrites every key ptdash ever
used there (rank pids, pushed rows and events) causes no signal outside the run and no
foreign row in its store; another local user cannot reach the hub's rank socket."""

from __future__ import annotations

import json
import socket
import subprocess
from datetime import timedelta

import pytest
import torch.distributed as dist

from support import users
from support.runner import SCRIPTS, Run, kill_all, processes_in, ptdash, wait_for

pytestmark = pytest.mark.slow

FORGED_STEP = 1_000_002_999


def _store_port(pid: int) -> int:
    environ = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    return int(next(v for v in environ if v.startswith(b"MASTER_PORT=")).split(b"=", 1)[1])


def test_forged_store_keys_cause_no_signal_and_no_row(tmp_path):
    victim = subprocess.Popen(["sleep", "600"])
    run = Run(tmp_path, SCRIPTS / "ddp_train.py", "--sleep", "0.02", options=("--nproc-per-node", "2"))
    try:
        wait_for(lambda: run.last_step(0) >= 3 and run.last_step(1) >= 3, 120, what="both ranks stepping")
        # Anyone who can reach the port can write the job's store: torch's TCPStore has no
        # authentication. Rewrite every key older ptdash versions put there.
        store = dist.TCPStore("127.0.0.1", _store_port(run.info().pid), is_master=False,
                              timeout=timedelta(seconds=30), wait_for_workers=False)
        forged_row = json.dumps({"rows": [[FORGED_STEP, 1.0, {"loss": -1.0}]], "samples": [],
                                 "events": [{"type": "event", "v": 2, "kind": "finding", "step": FORGED_STEP,
                                             "wall": 1.0, "message": "forged finding", "data": {}, "rank": 0}]})
        for prefix in ("ptdash/", ""):
            for rank in (0, 1):
                store.set(f"{prefix}pid/{rank}", f"{socket.gethostname()} {victim.pid}")
                for seq in range(50):
                    store.set(f"{prefix}m/{rank}/{seq}", forged_row)
        step = run.last_step(0)
        run.wait_step(step + 20, rank=1)  # the job goes on, and every flush since is the ranks' own
        killed = ptdash("ctl", str(run.run_dir), "kill", cwd=tmp_path)
        assert killed.returncode == 0, killed.stderr
        run.proc.wait(60)
        assert victim.poll() is None  # the forged pid was never signalled
        with run.store() as s:
            assert max(s.last_step(0), s.last_step(1)) < FORGED_STEP
            assert not [e for e in s.events() if "forged" in e.message]
            assert all(v != -1.0 for v in s.series("loss", rank=1)[1])
    finally:
        victim.kill()
        run.close()
        kill_all(processes_in(tmp_path))


@pytest.mark.skipif(users.skip_reason() is not None, reason=users.skip_reason() or "")
def test_another_user_cannot_reach_the_rank_socket(tmp_path):
    run = Run(tmp_path, SCRIPTS / "ddp_spawn.py", "--sleep", "0.02")
    try:
        wait_for(lambda: run.last_step(0) >= 2 and run.last_step(1) >= 2, 120, what="both ranks stepping")
        from ptdash.link import socket_path

        path = socket_path(run.info().socket)
        assert path.exists() and oct(path.stat().st_mode & 0o777) == "0o600"
        probe = ("import socket, sys\n"
                 "s = socket.socket(socket.AF_UNIX)\n"
                 "try:\n    s.connect(sys.argv[1])\nexcept OSError as e:\n    print(type(e).__name__)\n"
                 "else:\n    print('connected')\n")
        with users.throwaway_user() as intruder:
            result = users.as_user(intruder, users.system_python(), "-c", probe, str(path))
        assert result.stdout.strip() == "PermissionError", (result.stdout, result.stderr)
        assert run.send("stop").ok
        assert run.wait(120) == 0
    finally:
        run.close()
        kill_all(processes_in(tmp_path))
