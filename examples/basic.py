"""The plainest training loop: a small MLP fitting a noisy 1-D function.

A plain PyTorch script that knows nothing about ptdash. The data come from a seeded
generator, so two runs with the same arguments produce bit-identical losses; tests use
`--loss-file` to check that running under ptdash does not change a single bit.
"""

import argparse

import torch
import torch.nn as nn


def make_data(n, generator):
    """`n` samples of y = sin(3x) + x^2/2 + noise, with x uniform in [-2, 2]."""
    x = torch.rand(n, 1, generator=generator) * 4 - 2
    y = torch.sin(3 * x) + 0.5 * x**2 + 0.05 * torch.randn(n, 1, generator=generator)
    return x, y


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--loss-file", help="write every step's loss here, one repr() per line")
    args = p.parse_args()

    torch.manual_seed(args.seed)  # for the weight init
    g = torch.Generator().manual_seed(args.seed)
    x, y = make_data(4096, g)

    model = nn.Sequential(nn.Linear(1, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps)
    loss_fn = nn.MSELoss()

    losses = []
    for step in range(1, args.steps + 1):
        idx = torch.randint(len(x), (args.batch_size,), generator=g)
        loss = loss_fn(model(x[idx]), y[idx])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()

        losses.append(loss.item())
        if step % 50 == 0 or step == args.steps:
            print(f"step {step} | loss {losses[-1]:.5f} | lr {scheduler.get_last_lr()[0]:.2e}", flush=True)

    if args.loss_file:
        with open(args.loss_file, "w") as f:
            f.writelines(repr(v) + "\n" for v in losses)


if __name__ == "__main__":
    main()
