"""A DDP job in which one rank skips a step: at step --at, rank --rank's batch has no labelled
example, so it ``continue``s past forward, backward and the optimizer's step. Its DDP backward
all-reduces are one behind the other ranks' from then on (pairing with the wrong steps', which
gloo does not notice), until the end: there it waits in the final ``dist.barrier()`` while the
others wait in their last backward, for the gradient all-reduce it will never make (until
--timeout: then gloo raises in every rank). Nothing the script calls by name differs until the
barrier; only the process group's own record does."""
import argparse
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=20)
p.add_argument("--at", type=int, default=12)
p.add_argument("--rank", type=int, default=1)
p.add_argument("--sleep", type=float, default=0.02)
p.add_argument("--timeout", type=float, default=1800, help="seconds a collective may wait (gloo's default)")
args = p.parse_args()

dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout))
rank = dist.get_rank()
torch.manual_seed(0)
model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step * 10 + rank)
    labels = torch.randint(0, 2, (16,), generator=g)
    if rank == args.rank and step == args.at:
        labels[:] = -1  # nothing labelled in this shard's batch
    return torch.randn(16, 8, generator=g), labels


for step in range(1, args.steps + 1):
    x, y = batch(step)
    keep = y >= 0
    if not keep.any():
        continue  # the bug: the other ranks' backward waits for this rank's gradients
    loss = nn.functional.cross_entropy(model(x[keep]), y[keep])
    opt.zero_grad()
    loss.backward()
    opt.step()
    time.sleep(args.sleep)
dist.barrier()
print(f"rank {rank} done", flush=True)
