"""An unmodified Adam regression loop (argparse, a model class, a DataLoader with a worker)
whose data may hold one bad batch: ``--bad wild`` multiplies the inputs of batch ``--at``
by 10,000 (finite, as a corrupt shard gives: a loss near 1e9), ``--bad inf`` / ``--bad nan``
put an inf or a NaN in it. ``--sleep`` slows each step (seconds), so that a test can act on a
pause. Prints the loss every 25 steps, then ``final loss X params finite B`` over a clean
batch."""
import argparse
import math
import time

import torch
from torch.utils.data import DataLoader, Dataset

p = argparse.ArgumentParser()
p.add_argument("--bad", choices=("wild", "inf", "nan", "none"), default="wild")
p.add_argument("--at", type=int, default=150, help="the bad batch (0-based)")
p.add_argument("--steps", type=int, default=300)
p.add_argument("--lr", type=float, default=3e-3)
p.add_argument("--sleep", type=float, default=0.0)
p.add_argument("--workers", type=int, default=1)
args = p.parse_args()


class Regression(Dataset):
    def __len__(self):
        return args.steps * 32

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(16, generator=g)
        y = (x[:8].sum() * 0.3).unsqueeze(0)
        if i // 32 == args.at:
            if args.bad == "wild":
                x = x * 10000.0
            elif args.bad in ("inf", "nan") and i % 32 == 0:
                x[0] = math.inf if args.bad == "inf" else math.nan
        return x, y


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 64),
                                        torch.nn.GELU())
        self.head = torch.nn.Linear(64, 1)

    def forward(self, x):
        return self.head(self.body(x))


def main():
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    loader = DataLoader(Regression(), batch_size=32, shuffle=False, num_workers=args.workers)
    for step, (x, y) in enumerate(loader):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 25 == 0:
            print(f"step {step} loss {loss.item():.4g}", flush=True)
        if args.sleep:
            time.sleep(args.sleep)
    g = torch.Generator().manual_seed(12345)
    x = torch.randn(512, 16, generator=g)
    with torch.no_grad():
        final = torch.nn.functional.mse_loss(model(x), x[:, :8].sum(1, keepdim=True) * 0.3).item()
    finite = all(bool(torch.isfinite(q).all()) for q in model.parameters())
    print(f"final loss {final:.6g} params finite {finite}", flush=True)


if __name__ == "__main__":
    main()
