"""The textbook DDP skeleton ("Getting Started with Distributed Data Parallel"):
``mp.spawn(train, args=(world_size, args), nprocs=world_size)``, an explicit rank and
world size to ``init_process_group("gloo")``, a DDP model and a DistributedSampler with
``set_epoch``. The main process only picks a port, spawns and joins. ``--fork`` starts
the ranks as ``multiprocessing.Process`` targets with the fork start method instead
(Linux's default for multiprocessing), as hand-written launchers do.

Each rank saves its final parameters to params-<rank>.pt and prints "rank R finally ran"
from a ``finally`` block, however training ends.
"""
import argparse
import multiprocessing
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
        self.net1 = nn.Linear(8, 32)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(32, 1)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train(rank, world_size, args):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4096, 8, generator=g) * 10
    dataset = TensorDataset(x, x.sum(1, keepdim=True))
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, seed=0)
    loader = DataLoader(dataset, batch_size=16, sampler=sampler, num_workers=args.workers,
                        persistent_workers=args.workers > 0)
    model = DDP(ToyModel())
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    step = 0
    try:
        for epoch in range(args.epochs):
            sampler.set_epoch(epoch)
            for inputs, targets in loader:
                if rank == 1 and step + 1 == args.crash_rank1_at:
                    raise RuntimeError(f"rank 1 fails at step {step + 1}")
                optimizer.zero_grad()
                loss = nn.functional.mse_loss(model(inputs), targets)
                loss.backward()
                optimizer.step()
                step += 1
                if step % 50 == 0 and rank == 0:
                    print(f"epoch {epoch} step {step} loss {loss.item():.4f}", flush=True)
                time.sleep(args.sleep)
    finally:
        torch.save({k: v.clone() for k, v in model.module.state_dict().items()}, f"params-{rank}.pt")
        print(f"rank {rank} finally ran", flush=True)
        dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=1000)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--sleep", type=float, default=0.02)
    parser.add_argument("--fork", action="store_true")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader workers per rank")
    parser.add_argument("--crash-rank1-at", type=int, default=0, help="rank 1 raises before this step")
    args = parser.parse_args()
    args.port = free_port()
    if args.fork:
        context = multiprocessing.get_context("fork")
        ranks = [context.Process(target=train, args=(rank, args.world_size, args)) for rank in range(args.world_size)]
        for process in ranks:
            process.start()
        for process in ranks:
            process.join()
        if any(process.exitcode for process in ranks):
            raise SystemExit(f"ranks failed: {[process.exitcode for process in ranks]}")
    else:
        mp.spawn(train, args=(args.world_size, args), nprocs=args.world_size, join=True)
    print("all ranks joined", flush=True)


if __name__ == "__main__":
    main()
