"""A DDP job (gloo, torchrun-style, argparse) with two bugs planted for the doctor: the model
trains in eval mode (its Dropout is off), and the script raises a Python warning at step 3.
Each step sleeps ``--sleep``, so a test can stop a rank's process mid-run."""
import argparse
import time
import warnings

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.1))
        self.head = nn.Linear(32, 1)

    def forward(self, x):
        return self.head(self.body(x))


p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=100000)
p.add_argument("--sleep", type=float, default=0.02)
args = p.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(Net())
model.eval()  # planted: trains in eval mode
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for step in range(1, args.steps + 1):
    g = torch.Generator().manual_seed(step * 10 + rank)
    x = torch.randn(16, 8, generator=g)
    loss = nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step == 3:
        warnings.warn("planted warning from the script")
    time.sleep(args.sleep)
print(f"rank {rank} done", flush=True)
dist.destroy_process_group()
