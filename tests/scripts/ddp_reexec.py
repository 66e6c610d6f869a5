"""DDP started the way PyTorch Lightning's subprocess launcher does it, without Lightning:
the process the user started becomes rank 0 and re-executes
``[sys.executable, os.path.abspath(__file__)] + sys.argv[1:]`` for rank 1 with RANK,
LOCAL_RANK and WORLD_SIZE in its environment; rank 0 sets its own only after spawning.
``--bare-child`` starts the child with a clean environment (as some cluster wrappers do),
so it runs without ptdash.

Each rank saves its final parameters to params-<rank>.pt and prints "rank R finally ran".
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


def launch_children(bare):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    children = []
    for rank in range(1, WORLD_SIZE):
        base = {"PATH": os.environ["PATH"]} if bare else dict(os.environ)
        env = {**base, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(WORLD_SIZE),
               "MASTER_ADDR": os.environ["MASTER_ADDR"], "MASTER_PORT": os.environ["MASTER_PORT"]}
        children.append(subprocess.Popen([sys.executable, os.path.abspath(__file__)] + sys.argv[1:], env=env))
    os.environ.update(WORLD_SIZE=str(WORLD_SIZE), RANK="0", LOCAL_RANK="0")
    return children


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=1000)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--sleep", type=float, default=0.02)
    parser.add_argument("--bare-child", action="store_true")
    parser.add_argument("--crash-rank1-at", type=int, default=0, help="rank 1 raises at this step")
    args = parser.parse_args()
    children = launch_children(args.bare_child) if "LOCAL_RANK" not in os.environ else []
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", rank=rank, world_size=int(os.environ["WORLD_SIZE"]))
    torch.manual_seed(42)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(4096, 4, generator=g)
    dataset = TensorDataset(x, x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]))
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1)))
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    step = 0
    try:
        for epoch in range(args.epochs):
            sampler.set_epoch(epoch)
            for inputs, targets in loader:
                step += 1
                if rank == 1 and step == args.crash_rank1_at:
                    raise RuntimeError(f"rank 1 fails at step {step}")
                optimizer.zero_grad()
                loss = nn.functional.mse_loss(model(inputs), targets)
                loss.backward()
                optimizer.step()
                time.sleep(args.sleep)
    finally:
        torch.save({k: v.clone() for k, v in model.module.state_dict().items()}, f"params-{rank}.pt")
        print(f"rank {rank} finally ran", flush=True)
        for child in children:
            child.wait()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
