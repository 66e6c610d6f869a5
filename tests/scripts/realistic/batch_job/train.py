"""A batch job as people write them: argparse, a model module, a DataLoader, epochs, a
cosine schedule, a print per step, and cleanup in ``finally`` (which must run however the
job is ended: a finished loop, a scheduler's SIGTERM, a stop).

``--nan-at N`` plants a non-finite gradient at global step N (a bad batch); ``--sleep``
makes each step take at least that long, so signals land mid-run; ``--wait-for PATH``
waits before step ``--wait-at`` until PATH exists (a test's stand-in for a job that runs
long enough for something to happen to it, such as its disk filling up).
"""
import argparse
import math
import os
import time

import torch
from model import Regressor
from torch.utils.data import DataLoader, TensorDataset


def parse_args():
    p = argparse.ArgumentParser(description="train a regressor")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--samples", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--nan-at", type=int, default=None)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--wait-for", default=None)
    p.add_argument("--wait-at", type=int, default=1)
    return p.parse_args()


def make_data(n, features=16):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, features, generator=g)
    y = (x[:, :4].sum(1, keepdim=True) + 0.1 * torch.randn(n, 1, generator=g))
    return TensorDataset(x, y)


def main():
    args = parse_args()
    torch.manual_seed(0)
    loader = DataLoader(make_data(args.samples), batch_size=args.batch_size, shuffle=True,
                        num_workers=args.workers, generator=torch.Generator().manual_seed(1))
    model = Regressor(16, args.hidden)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.epochs * len(loader))
    step = 0
    print(f"training for {args.epochs} epochs of {len(loader)} steps", flush=True)
    try:
        for epoch in range(args.epochs):
            for x, y in loader:
                if args.wait_for and step + 1 == args.wait_at:
                    while not os.path.exists(args.wait_for):
                        time.sleep(0.05)
                loss = torch.nn.functional.mse_loss(model(x), y)
                opt.zero_grad()
                loss.backward()
                step += 1
                if args.nan_at == step:
                    model.head.weight.grad[0, 0] = math.nan
                opt.step()
                sched.step()
                print(f"epoch {epoch} step {step} loss {loss.item():.6f}", flush=True)
                if args.sleep:
                    time.sleep(args.sleep)
        print("training done", flush=True)
    finally:
        finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
        print(f"finally: cleanup ran after step {step}, params finite {finite}", flush=True)


if __name__ == "__main__":
    main()
