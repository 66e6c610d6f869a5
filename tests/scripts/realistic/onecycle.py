"""Epoch-based training with ``OneCycleLR(total_steps=len(loader) * epochs)`` stepped after
every batch, as in the fast.ai-inspired CIFAR scripts. There is no resume logic: it loops
over its epochs from the first, and OneCycleLR raises if it is stepped more often than
``total_steps``.
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def make_dataset(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 10, generator=g)
    w = torch.linspace(-1, 1, 10)
    y = ((x @ w) + 0.3 * torch.randn(n, generator=g) > 0).long()
    return TensorDataset(x, y)


def main():
    parser = argparse.ArgumentParser(description="OneCycleLR stepped per batch")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    loader = DataLoader(make_dataset(2048, args.seed), batch_size=args.batch_size, shuffle=True)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.max_lr, momentum=0.9, nesterov=True)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.max_lr,
                                                    total_steps=len(loader) * args.epochs)

    for epoch in range(args.epochs):
        running_loss = 0.0
        for inputs, labels in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(inputs), labels)
            loss.backward()
            optimizer.step()
            scheduler.step()
            running_loss += loss.item()
        print(f"epoch {epoch + 1}/{args.epochs} loss {running_loss / len(loader):.4f} "
              f"lr {scheduler.get_last_lr()[0]:.6f}")
    print("done")


if __name__ == "__main__":
    main()
