"""A step-based training loop with a validation pass every ``--eval-every`` steps, the
shape of most GitHub training scripts: a training DataLoader that shuffles, a separate
validation DataLoader that does not, and an ``evaluate()`` run under ``model.eval()`` and
``torch.no_grad()`` over ``--eval-batches`` batches before going back to ``model.train()``.

``--sleep-eval`` makes each validation batch take that many extra seconds.
"""
import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def make_blobs(n, num_classes, dim, seed):
    """Gaussian blobs around fixed class centres; `seed` picks the sample, not the centres."""
    centres = torch.randn(num_classes, dim, generator=torch.Generator().manual_seed(42)) * 0.6
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, num_classes, (n,), generator=g)
    features = centres[labels] + torch.randn(n, dim, generator=g)
    return TensorDataset(features, labels)


class MLP(nn.Module):
    def __init__(self, dim, hidden, num_classes):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.bn = nn.BatchNorm1d(hidden)
        self.drop = nn.Dropout(0.2)
        self.fc2 = nn.Linear(hidden, num_classes)

    def forward(self, x):
        return self.fc2(self.drop(F.relu(self.bn(self.fc1(x)))))


@torch.no_grad()
def evaluate(model, loader, max_batches, sleep):
    model.eval()
    total_loss, correct, count = 0.0, 0, 0
    for i, (x, y) in enumerate(loader):
        if i == max_batches:
            break
        logits = model(x)
        total_loss += F.cross_entropy(logits, y, reduction="sum").item()
        correct += (logits.argmax(1) == y).sum().item()
        count += len(y)
        if sleep:
            time.sleep(sleep)
    model.train()
    return total_loss / count, correct / count


def main():
    parser = argparse.ArgumentParser(description="Train with periodic validation")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--eval-every", type=int, default=20, help="validate every N steps (default: 20)")
    parser.add_argument("--eval-batches", type=int, default=20, help="validation batches per pass (default: 20)")
    parser.add_argument("--sleep-eval", type=float, default=0.0, help="extra seconds per validation batch")
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    train_set = make_blobs(2000, 5, 16, seed=1)
    val_set = make_blobs(2000, 5, 16, seed=2)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True, drop_last=True)
    val_loader = DataLoader(val_set, batch_size=100, shuffle=False)

    model = MLP(16, 64, 5)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)

    step = 0
    model.train()
    while step < args.steps:
        for x, y in train_loader:
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1

            if step % args.log_every == 0:
                print(f"step {step} train_loss {loss.item():.4f}")
            if step % args.eval_every == 0:
                val_loss, acc = evaluate(model, val_loader, args.eval_batches, args.sleep_eval)
                print(f"step {step} val_loss {val_loss:.4f} acc: {acc:.3f}")
            if step == args.steps:
                break
    print("done")


if __name__ == "__main__":
    main()
