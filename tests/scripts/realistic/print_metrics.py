"""Metrics printed in the forms scripts in the wild use, all from one small classifier:

    step 10 | loss 1.2345 | lr 3.0e-03          (every --log-every steps)
    val_loss=0.9876 val_acc=0.51                (every --eval-every steps)
    | step | loss | acc |  then  | 20 | 0.812 | 0.55 |   (a markdown-ish table, same schedule)
    epoch 1: train_loss: 1.23, acc: 0.97        (after each epoch)

and a tqdm-like progress bar redrawn with ``\\r`` every step, on stderr as tqdm does unless
``--bar-stream stdout`` puts it between the metric lines (cleared and redrawn around each
line, as ``tqdm.write`` does).
"""
import argparse
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class ProgressBar:
    """A minimal stand-in for tqdm: `update()` redraws in place, `write()` prints above the bar."""

    def __init__(self, total, desc, stream, width=20):
        self.total, self.desc, self.stream, self.width = total, desc, stream, width
        self.n, self.postfix, self.last_len = 0, "", 0

    def _render(self):
        filled = self.width * self.n // self.total
        bar = "\u2588" * filled + " " * (self.width - filled)
        return f"{self.desc}: {100 * self.n // self.total:3d}%|{bar}| {self.n}/{self.total} [{self.postfix}]"

    def _draw(self, text):
        self.stream.write("\r" + text)
        self.stream.flush()
        self.last_len = len(text)

    def update(self, postfix):
        self.n += 1
        self.postfix = postfix
        self._draw(self._render())

    def write(self, message):
        if self.stream is sys.stdout:
            self.stream.write("\r" + " " * self.last_len + "\r")
            print(message)
            self._draw(self._render())
        else:
            print(message)

    def close(self):
        self.stream.write("\n")
        self.stream.flush()


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))

    def forward(self, x):
        return self.layers(x)


def make_split(n, seed):
    centres = torch.tensor([[1.0] * 8, [-1.0] * 8, [1.0, -1.0] * 4]) * 0.4
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 3, (n,), generator=g)
    return TensorDataset(centres[y] + torch.randn(n, 8, generator=g), y)


@torch.no_grad()
def validate(model, loader):
    model.eval()
    losses, correct, total = 0.0, 0, 0
    for x, y in loader:
        out = model(x)
        losses += F.cross_entropy(out, y, reduction="sum").item()
        correct += (out.argmax(1) == y).sum().item()
        total += len(y)
    model.train()
    return losses / total, correct / total


def main():
    parser = argparse.ArgumentParser(description="Print metrics in several common formats")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--warmup-steps", type=int, default=10)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--eval-every", type=int, default=20)
    parser.add_argument("--bar-stream", choices=["stderr", "stdout", "none"], default="stderr",
                        help="where the progress bar goes (default: stderr, like tqdm)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    train_loader = DataLoader(make_split(800, 1), batch_size=args.batch_size, shuffle=True)
    val_loader = DataLoader(make_split(400, 2), batch_size=200)
    model = Classifier()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / args.warmup_steps))
    stream = {"stderr": sys.stderr, "stdout": sys.stdout, "none": None}[args.bar_stream]

    print("| step | loss | acc |")
    print("|------|------|-----|")
    step = 0
    for epoch in range(1, args.epochs + 1):
        bar = ProgressBar(len(train_loader), f"epoch {epoch}", stream) if stream else None
        epoch_loss, epoch_correct, seen = 0.0, 0, 0
        for x, y in train_loader:
            out = model(x)
            loss = F.cross_entropy(out, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            lr = scheduler.get_last_lr()[0]
            scheduler.step()
            step += 1

            acc = (out.argmax(1) == y).float().mean().item()
            epoch_loss += loss.item() * len(y)
            epoch_correct += (out.argmax(1) == y).sum().item()
            seen += len(y)
            write = bar.write if bar else print
            if bar:
                bar.update(f"loss={loss.item():.3f}")
            if step % args.log_every == 0:
                write(f"step {step} | loss {loss.item():.4f} | lr {lr:.1e}")
            if step % args.eval_every == 0:
                val_loss, val_acc = validate(model, val_loader)
                write(f"val_loss={val_loss:.4f} val_acc={val_acc:.2f}")
                write(f"| {step} | {loss.item():.3f} | {acc:.2f} |")
        if bar:
            bar.close()
        print(f"epoch {epoch}: train_loss: {epoch_loss / seen:.2f}, acc: {epoch_correct / seen:.2f}")
    print("done")


if __name__ == "__main__":
    main()
