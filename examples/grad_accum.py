"""Gradient accumulation: several micro-batches per optimizer step.

A plain PyTorch script that knows nothing about ptdash. Each optimizer step runs
`--accum` forward/backward passes, so backward fires more often than the optimizer
steps; a monitor has to count steps at `optimizer.step()`, not at `backward()`.
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


def make_data(n, n_classes, dim, generator):
    """`n` points from `n_classes` Gaussian clusters in `dim` dimensions.

    The clusters overlap, so the loss levels off well above zero instead of vanishing.
    """
    centers = 0.7 * torch.randn(n_classes, dim, generator=generator)
    labels = torch.randint(n_classes, (n,), generator=generator)
    points = centers[labels] + torch.randn(n, dim, generator=generator)
    return points, labels


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200, help="optimizer steps")
    p.add_argument("--accum", type=int, default=4, help="micro-batches per optimizer step")
    p.add_argument("--micro-batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--loss-file", help="write each optimizer step's loss here, one repr() per line")
    args = p.parse_args()

    torch.manual_seed(args.seed)  # for the weight init
    g = torch.Generator().manual_seed(args.seed)
    x, y = make_data(8192, n_classes=10, dim=16, generator=g)

    model = nn.Sequential(nn.Linear(16, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 10))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)

    losses = []
    for step in range(1, args.steps + 1):
        optimizer.zero_grad()
        step_loss = 0.0
        for _ in range(args.accum):
            idx = torch.randint(len(x), (args.micro_batch_size,), generator=g)
            # Dividing by the count makes the summed gradient the mean over all micro-batches,
            # so the learning rate does not depend on --accum.
            loss = F.cross_entropy(model(x[idx]), y[idx]) / args.accum
            loss.backward()
            step_loss += loss.item()
        optimizer.step()

        losses.append(step_loss)
        if step % 50 == 0 or step == args.steps:
            print(f"step {step} | loss {step_loss:.5f}", flush=True)

    if args.loss_file:
        with open(args.loss_file, "w") as f:
            f.writelines(repr(v) + "\n" for v in losses)


if __name__ == "__main__":
    main()
