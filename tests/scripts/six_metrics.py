"""A classifier's training loop (argparse, a DataLoader with workers, Adam, an evaluation every
``--eval-every`` steps) that prints six metrics in one table row per evaluation:
``train_acc``, ``train_f1``, ``valid_loss``, ``valid_acc``, ``valid_f1``, ``valid_ppl``. (A printed
``train_loss`` would be ptdash's own ``loss``, kept once: engine/printed.py's twins.)"""
import argparse
import math

import torch
from torch.utils.data import DataLoader, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=60)
p.add_argument("--eval-every", type=int, default=10)
p.add_argument("--workers", type=int, default=1)
args = p.parse_args()

torch.manual_seed(0)
x = torch.randn(2048, 16)
y = (x[:, :4].sum(1) > 0).long()
train = DataLoader(TensorDataset(x[:1536], y[:1536]), batch_size=32, shuffle=True, num_workers=args.workers)
valid_x, valid_y = x[1536:], y[1536:]
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
opt = torch.optim.Adam(model.parameters(), lr=3e-3)


def scores(logits, labels):
    """Accuracy and F1 of the positive class."""
    pred = logits.argmax(1)
    tp = ((pred == 1) & (labels == 1)).sum().item()
    f1 = 2 * tp / max(1, (pred == 1).sum().item() + (labels == 1).sum().item())
    return (pred == labels).float().mean().item(), f1


def evaluate():
    model.eval()
    with torch.no_grad():
        logits = model(valid_x)
        loss = torch.nn.functional.cross_entropy(logits, valid_y).item()
    model.train()
    return (loss, *scores(logits, valid_y))


step = 0
while step < args.steps:
    for xb, yb in train:
        logits = model(xb)
        loss = torch.nn.functional.cross_entropy(logits, yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if step % args.eval_every == 0:
            acc, f1 = scores(logits.detach(), yb)
            v_loss, v_acc, v_f1 = evaluate()
            print(f"| step {step} | train_acc {acc:.3f} | train_f1 {f1:.3f} | valid_loss {v_loss:.4f} "
                  f"| valid_acc {v_acc:.3f} | valid_f1 {v_f1:.3f} | valid_ppl {math.exp(v_loss):.3f} |", flush=True)
        if step >= args.steps:
            break
