"""DDP over NCCL in a group of one (one GPU is enough), holding at a step until a file is gone.

    python nccl_one_rank.py --hold FILE [--at 10] [--steps 20]

At step --at it all-reduces 25 floats by name, prints 'holding', and waits while FILE
exists: a test asks for its stacks there and reads the flight recorder's NCCL entries
(DDP's reducer's all-reduces and the named one).
"""
import argparse
import os
import tempfile
import time

import torch
import torch.distributed as dist
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--hold", required=True)
p.add_argument("--at", type=int, default=10)
p.add_argument("--steps", type=int, default=20)
args = p.parse_args()

dist.init_process_group("nccl", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1,
                        device_id=torch.device("cuda:0"))
torch.manual_seed(0)
model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)).cuda(),
                                            device_ids=[0])
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(1, args.steps + 1):
    loss = model(torch.randn(64, 32, device="cuda")).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step == args.at:
        dist.all_reduce(torch.ones(25, device="cuda"))
        torch.cuda.synchronize()
        print("holding", flush=True)
        while os.path.exists(args.hold):
            time.sleep(0.05)
dist.destroy_process_group()
print("NCCL OK", f"{loss.item():.4f}")
