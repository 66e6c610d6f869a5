"""Regression with the script clipping its own gradients: ``clip_grad_norm_`` between
``loss.backward()`` and ``optimizer.step()``, SGD with momentum and a StepLR scheduler,
the usual shape of a repo's train loop with a ``--max-norm`` flag.

With ``--print-norms`` it prints, every step, the total gradient norm it measures itself
after clipping (what the optimizer is about to apply).
"""
import argparse
import time

import torch
import torch.nn as nn


class Regressor(nn.Module):
    def __init__(self, in_features=8, hidden=32):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, x):
        return self.net(x).squeeze(-1)


def get_batch(step, batch_size):
    """Data depends only on the step, so a run is a pure function of its flags."""
    g = torch.Generator().manual_seed(step)
    x = torch.randn(batch_size, 8, generator=g) * 3
    y = x[:, :4].sum(1) - 0.5 * x[:, 4:].sum(1)
    return x, y


def main():
    parser = argparse.ArgumentParser(description="Regression with clip_grad_norm_ in the script")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.002)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--max-norm", type=float, default=1000.0, help="clip_grad_norm_ max_norm (default: 1000)")
    parser.add_argument("--print-norms", action="store_true", help="print each step's post-clip gradient norm")
    parser.add_argument("--log-every", type=int, default=20)
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds to sleep per step (default: 0)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    model = Regressor()
    criterion = nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=100, gamma=0.5)

    for step in range(1, args.steps + 1):
        x, y = get_batch(step, args.batch_size)
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_norm)
        if args.print_norms:
            norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
            print(f"step {step} post-clip norm {norm.item():.6f}")
        optimizer.step()
        scheduler.step()
        if step % args.log_every == 0:
            print(f"step {step} loss {loss.item():.6f} lr {scheduler.get_last_lr()[0]:.6f}")
        if args.sleep:
            time.sleep(args.sleep)
    print("done")


if __name__ == "__main__":
    main()
