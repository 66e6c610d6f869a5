"""DDP launched the way PyTorch Lightning's subprocess script launcher does it, without
Lightning: the process the user started becomes rank 0 and, when no ``LOCAL_RANK`` is
set, re-executes this very script with ``subprocess.Popen([sys.executable,
os.path.abspath(__file__)] + sys.argv[1:], env=...)`` for rank 1. Rank 0 sets its own
``WORLD_SIZE`` only after spawning. Both ranks then ``init_process_group("gloo")``, wrap
the model in DDP, shard the data with a DistributedSampler (``set_epoch`` each epoch),
print per rank, and rank 0 waits for its child before destroying its process group.
"""
import argparse
import os
import socket
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

WORLD_SIZE = 2


def find_free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_children():
    """Start ranks 1.. as copies of this script; return the Popen handles."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(find_free_port())
    children = []
    for rank in range(1, WORLD_SIZE):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(WORLD_SIZE),
               "MASTER_ADDR": os.environ["MASTER_ADDR"], "MASTER_PORT": os.environ["MASTER_PORT"]}
        command = [sys.executable, os.path.abspath(__file__)] + sys.argv[1:]
        children.append(subprocess.Popen(command, env=env))
    os.environ["WORLD_SIZE"] = str(WORLD_SIZE)
    os.environ["RANK"] = os.environ["LOCAL_RANK"] = "0"
    return children


def main():
    parser = argparse.ArgumentParser(description="Self re-executing DDP launcher, Lightning style")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6, help="steps per epoch (default: 6)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds to sleep per step")
    args = parser.parse_args()

    children = launch_children() if "LOCAL_RANK" not in os.environ else []
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    print(f"[rank {rank}] initialized: world_size {dist.get_world_size()} pid-is-launcher {bool(children)}",
          flush=True)

    torch.manual_seed(42)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(256, 4, generator=g)
    dataset = TensorDataset(x, x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]))
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1)))
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for step, (inputs, targets) in enumerate(loader):
            if step == args.steps:
                break
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(inputs), targets)
            loss.backward()
            optimizer.step()
            print(f"[rank {rank}] epoch {epoch} step {step} loss {loss.item():.6f}", flush=True)
            if args.sleep:
                time.sleep(args.sleep)

    total = sum(p.detach().double().sum().item() for p in model.parameters())
    print(f"[rank {rank}] final parameter sum {total:.12f}", flush=True)
    # Rank 0 hosts the rendezvous store, so it outlives its children.
    dist.barrier()
    failed = [c.args for c in children if c.wait() != 0]
    dist.destroy_process_group()
    if failed:
        sys.exit(f"child ranks failed: {failed}")
    if rank == 0:
        print("done")


if __name__ == "__main__":
    main()
