"""A 2-rank DDP loop (gloo) with SGD momentum and a cosine schedule, whose rank 1 gets one
wild batch (inputs x10000) at step --at. Data depends only on the step and the rank. Each
rank saves its final parameters to params-<rank>.pt and prints its final clean loss."""
import argparse
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=150)
p.add_argument("--at", type=int, default=70)
p.add_argument("--sleep", type=float, default=0.01)
args = p.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps)
for step in range(args.steps):
    g = torch.Generator().manual_seed(step * 10 + rank)
    x = torch.randn(16, 8, generator=g)
    if rank == 1 and step == args.at:
        x = x * 10000.0
    loss = torch.nn.functional.mse_loss(model(x), x[:, :4].sum(1, keepdim=True) * 0.5)
    opt.zero_grad()
    loss.backward()
    opt.step()
    sched.step()
    time.sleep(args.sleep)
torch.save({k: v.clone() for k, v in model.module.state_dict().items()}, f"params-{rank}.pt")
x = torch.randn(256, 8, generator=torch.Generator().manual_seed(12345))
with torch.no_grad():
    final = torch.nn.functional.mse_loss(model.module(x), x[:, :4].sum(1, keepdim=True) * 0.5).item()
print(f"rank {rank} final loss {final:.6g}", flush=True)
with open(f"final-{rank}.txt", "w") as f:  # the two ranks' prints may interleave in one output
    f.write(repr(final))
dist.destroy_process_group()
