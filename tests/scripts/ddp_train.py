"""A DDP training loop for 2-rank tests (gloo). Data depends only on the step and rank.

Env PTDASH_TEST_PG_TIMEOUT sets the process-group timeout in seconds. Each rank writes
its final parameters to params-<rank>.pt and prints 'rank R finally ran'.
"""
import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=100000)
p.add_argument("--sleep", type=float, default=0.02)
args = p.parse_args()

timeout = datetime.timedelta(seconds=float(os.environ.get("PTDASH_TEST_PG_TIMEOUT", 1800)))
dist.init_process_group("gloo", timeout=timeout)
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
try:
    for step in range(args.steps):
        g = torch.Generator().manual_seed(step * 10 + rank)
        x = torch.randn(16, 8, generator=g) * 10
        loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(args.sleep)
finally:
    torch.save({k: v.clone() for k, v in model.module.state_dict().items()}, f"params-{rank}.pt")
    print(f"rank {rank} finally ran", flush=True)
    dist.destroy_process_group()
