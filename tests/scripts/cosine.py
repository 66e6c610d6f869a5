"""A plain loop with CosineAnnealingLR stepped every step: no total the engine can read from
the scheduler's length, only T_max. ``--by-hand`` sets the LR itself each step instead.

From step 60 on it goes slowly (20 ms a step) until the run's store holds what the
engine says about the schedule, so the test does not depend on how fast the flusher is.
"""
import os
import sqlite3
import sys
import time
from pathlib import Path

import torch


def schedule_stored() -> bool:
    with sqlite3.connect(Path(os.environ["PTDASH_RUN_DIR"]) / "metrics.db") as con:
        return con.execute("SELECT 1 FROM blobs WHERE kind = 'schedule'").fetchone() is not None


by_hand = "--by-hand" in sys.argv
stored = False
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=300)
for step in range(300):
    if by_hand:
        for group in opt.param_groups:
            group["lr"] = 0.1 / (1 + step)
    loss = model(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if not by_hand:
        sched.step()
    if step >= 60 and not stored:
        stored = schedule_stored()
    time.sleep(0.002 if step < 60 or stored else 0.02)
