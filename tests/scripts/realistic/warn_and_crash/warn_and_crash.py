"""A small training script that warns and crashes the ways real ones do.

``--warn`` builds its AMP scaler with the deprecated ``torch.cuda.amp.GradScaler(...)``
(a FutureWarning pointing at this file) and its optimizer through ``helpers.build_optimizer``
with a deprecated keyword (a UserWarning raised with ``stacklevel=2``, so it also points
here). ``--crash-at N`` makes the model's forward call a check in helpers.py that raises
at step N, so the traceback runs through frames of both files. ``--print-file`` prints
``__file__``, ``sys.argv[0]`` and ``sys.path[0]``.
"""
import argparse
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from helpers import build_optimizer, check_activations


class Net(nn.Module):
    def __init__(self, crash_at):
        super().__init__()
        self.fc1 = nn.Linear(6, 16)
        self.fc2 = nn.Linear(16, 1)
        self.crash_at = crash_at
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        h = check_activations(torch.relu(self.fc1(x)), self.calls, self.crash_at)
        return self.fc2(h)


def train_step(model, optimizer, scaler, x, y):
    optimizer.zero_grad()
    loss = F.mse_loss(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return loss.item()


def main():
    parser = argparse.ArgumentParser(description="Warnings and a crash across two files")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--warn", action="store_true", help="use deprecated APIs that emit warnings")
    parser.add_argument("--crash-at", type=int, default=0, metavar="N", help="raise from the model at step N")
    parser.add_argument("--print-file", action="store_true", help="print __file__, sys.argv[0] and sys.path[0]")
    args = parser.parse_args()

    if args.print_file:
        print(f"__file__ {__file__}")
        print(f"argv[0] {sys.argv[0]}")
        print(f"path[0] {sys.path[0]}")

    torch.manual_seed(0)
    model = Net(args.crash_at)
    if args.warn:
        scaler = torch.cuda.amp.GradScaler(enabled=False)
        optimizer = build_optimizer(model.parameters(), args.lr, nesterov_momentum=0.9)
    else:
        scaler = torch.amp.GradScaler("cuda", enabled=False)
        optimizer = build_optimizer(model.parameters(), args.lr, momentum=0.9)

    g = torch.Generator().manual_seed(1)
    for step in range(1, args.steps + 1):
        x = torch.randn(16, 6, generator=g)
        y = x[:, :3].sum(1, keepdim=True)
        loss = train_step(model, optimizer, scaler, x, y)
        if step % 10 == 0:
            print(f"step {step} loss {loss:.4f}")
    print("done")


if __name__ == "__main__":
    main()
