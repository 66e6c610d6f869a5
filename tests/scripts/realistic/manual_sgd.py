"""Training without a torch.optim optimizer, as in the PyTorch tutorials
("Learning PyTorch with Examples", the char-RNN classification tutorial): zero the
gradients on the model, clip them, then update each parameter by hand under
``torch.no_grad()``.

``--backward-only N`` instead calls ``loss.backward()`` N times on a fixed 4x4 Linear,
zeroing the gradients each time and never updating anything.
"""
import argparse

import torch
import torch.nn as nn


def make_data(n, generator):
    x = torch.linspace(-3.0, 3.0, n).unsqueeze(1)
    y = torch.sin(x) + 0.1 * torch.randn(n, 1, generator=generator)
    return x, y


def train(args):
    g = torch.Generator().manual_seed(args.seed)
    x, y = make_data(256, g)
    model = nn.Sequential(nn.Linear(1, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1))
    loss_fn = nn.MSELoss()

    for t in range(1, args.steps + 1):
        idx = torch.randint(0, len(x), (args.batch_size,), generator=g)
        y_pred = model(x[idx])
        loss = loss_fn(y_pred, y[idx])

        model.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)

        with torch.no_grad():
            for param in model.parameters():
                param.add_(param.grad, alpha=-args.lr)

        if t % args.log_interval == 0:
            print(f"step {t} loss {loss.item():.6f}")

    with torch.no_grad():
        print(f"final loss {loss_fn(model(x), y).item():.6f}")


def backward_only(args):
    model = nn.Linear(4, 4)
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(args.seed))
    for _ in range(args.backward_only):
        model.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
    print(f"{args.backward_only} backward calls, last loss {loss.item():.6f}, "
          f"weight grad sum {model.weight.grad.sum().item():.6f}")


def main():
    parser = argparse.ArgumentParser(description="Manual SGD on a sine curve, no torch.optim")
    parser.add_argument("--steps", type=int, default=300, help="number of updates (default: 300)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05, help="learning rate (default: 0.05)")
    parser.add_argument("--clip", type=float, default=1.0, help="max gradient norm (default: 1.0)")
    parser.add_argument("--log-interval", type=int, default=50, help="print the loss every N steps (default: 50)")
    parser.add_argument("--backward-only", type=int, default=0, metavar="N",
                        help="only call backward() N times on a 4x4 Linear, with no updates")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    if args.backward_only:
        backward_only(args)
    else:
        train(args)
    print("done")


if __name__ == "__main__":
    main()
