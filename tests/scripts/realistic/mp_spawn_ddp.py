"""The textbook DDP skeleton of the PyTorch "Getting Started with Distributed Data
Parallel" tutorial: ``mp.spawn(train, args=(world_size, args), nprocs=world_size)``,
``setup()``/``cleanup()`` around ``init_process_group("gloo")``, a DDP-wrapped model and a
DistributedSampler with ``set_epoch(epoch)``. The main process only picks a free port,
spawns and joins.

Every rank prints its losses and, at the end, a checksum of its parameters (the float sum
and a SHA-256 of the raw bytes), so a test can check that the replicas agree bit for bit.
"""
import argparse
import hashlib
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 32)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(32, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def find_free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def setup(rank, world_size, port):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def cleanup():
    dist.destroy_process_group()


def checksum(model):
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    digest = hashlib.sha256(bytes(flat.view(torch.uint8).tolist())).hexdigest()
    return flat.double().sum().item(), digest[:16]


def train(rank, world_size, args):
    print(f"[rank {rank}] running DDP on {world_size} processes", flush=True)
    setup(rank, world_size, args.port)

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    dataset = TensorDataset(torch.randn(512, 10, generator=g), torch.randn(512, 5, generator=g))
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)

    model = ToyModel()
    ddp_model = DDP(model)
    loss_fn = nn.MSELoss()
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=args.lr)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for step, (inputs, labels) in enumerate(loader):
            if step == args.steps:
                break
            optimizer.zero_grad()
            loss = loss_fn(ddp_model(inputs), labels)
            loss.backward()
            optimizer.step()
            print(f"[rank {rank}] epoch {epoch} step {step} loss {loss.item():.6f}", flush=True)
            if args.sleep:
                time.sleep(args.sleep)

    total, digest = checksum(model)
    print(f"[rank {rank}] final parameter checksum {total:.12f} sha256 {digest}", flush=True)
    cleanup()


def main():
    parser = argparse.ArgumentParser(description="DDP with mp.spawn")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8, help="steps per epoch (default: 8)")
    parser.add_argument("--batch-size", type=int, default=16, help="per-rank batch size")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds to sleep per step")
    parser.add_argument("--port", type=int, default=0, help="MASTER_PORT (default: a free one)")
    args = parser.parse_args()
    if not args.port:
        args.port = find_free_port()

    world_size = args.world_size
    mp.spawn(train, args=(world_size, args), nprocs=world_size, join=True)
    print("done")


if __name__ == "__main__":
    main()
