"""L-BFGS with a closure: logistic regression on synthetic data.

A plain PyTorch script that knows nothing about ptdash. `LBFGS.step(closure)`
re-evaluates the loss and gradient several times per step (a line search), so
backward fires many times per optimizer step, and the loss comes back from `step()`.
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


def make_data(n, dim, generator):
    """`n` points labelled by a random hyperplane, then rescaled feature by feature.

    The feature scales span two orders of magnitude, so the problem is ill-conditioned
    and L-BFGS takes many steps instead of converging in two or three.
    """
    z = torch.randn(n, dim, generator=generator)
    y = (z @ torch.randn(dim, generator=generator) > 0).float()
    return z * torch.logspace(-1, 1, dim), y


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20, help="optimizer steps (each runs up to --max-iter iterations)")
    p.add_argument("--max-iter", type=int, default=2, help="L-BFGS iterations per step")
    p.add_argument("--lr", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--loss-file", help="write each step's loss here, one repr() per line")
    args = p.parse_args()

    torch.manual_seed(args.seed)  # for the weight init
    x, y = make_data(2048, dim=50, generator=torch.Generator().manual_seed(args.seed))

    model = nn.Linear(50, 1)
    optimizer = torch.optim.LBFGS(model.parameters(), lr=args.lr, max_iter=args.max_iter,
                                  history_size=10, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        loss = F.binary_cross_entropy_with_logits(model(x).squeeze(1), y)
        loss.backward()
        return loss

    losses = []
    for step in range(1, args.steps + 1):
        # step() returns the loss from the closure's first evaluation, i.e. before this step's update.
        loss = optimizer.step(closure)
        losses.append(loss.item())
        print(f"step {step} | loss {losses[-1]:.6f}", flush=True)

    if args.loss_file:
        with open(args.loss_file, "w") as f:
            f.writelines(repr(v) + "\n" for v in losses)


if __name__ == "__main__":
    main()
