"""A small classifier fed by a DataLoader with two workers, for the System and Layers screenshots.

The dataset takes a little time per sample, so the step-time split shows data waiting next
to compute; one parameter's gradient is scaled to nothing (vanishing) and one to a huge
norm (exploding), so the Layers tab has flags to show. A CosineAnnealingLR over the run.
"""
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

STEPS = 400


class Slowish(Dataset):
    def __len__(self):
        return 64 * STEPS

    def __getitem__(self, i):
        time.sleep(0.001)  # decoding an image, say
        g = torch.Generator().manual_seed(i)
        x = torch.randn(32, generator=g)
        return x, int(x[:4].sum() > 0)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU())
        self.head = nn.Linear(256, 2)
        self.gate = nn.Parameter(torch.ones(256))    # scaled to nothing: a vanishing gradient
        self.boost = nn.Parameter(torch.zeros(2))    # scaled up: an exploding one, adding nothing

    def forward(self, x):
        h = self.body(x) * (1 + 1e-9 * self.gate)
        # Zero whatever boost holds, so the loss never sees it: only its gradient is huge.
        return self.head(h) + 1e7 * (self.boost - self.boost.detach())


if __name__ == "__main__":
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS)
    loader = DataLoader(Slowish(), batch_size=64, num_workers=2, persistent_workers=True)
    for step, (x, y) in enumerate(loader, 1):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step % 50 == 0:
            print(f"step {step} | loss {loss.item():.4f}", flush=True)
        if step == STEPS:
            break
