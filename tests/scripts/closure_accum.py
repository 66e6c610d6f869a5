"""Gradient accumulation with AdamW, then LBFGS with a closure; writes what it computed."""
import json

import torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
x, y = torch.randn(64, 4), torch.randn(64, 1)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
accum = []
for step in range(10):
    total = 0.0
    for micro in range(4):
        xb, yb = x[micro * 16:(micro + 1) * 16], y[micro * 16:(micro + 1) * 16]
        loss = torch.nn.functional.mse_loss(model(xb), yb) / 4
        loss.backward()
        total = loss.detach() if micro == 0 else total + loss.detach()
    opt.step()
    opt.zero_grad()
    accum.append(total.item())

# The engine's main optimizer is the first that stepped (AdamW); make LBFGS the only one.
del opt
lbfgs = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=3)
first = []


def closure():
    lbfgs.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    return loss


for step in range(5):
    first.append(lbfgs.step(closure).item())
json.dump({"accum": accum, "lbfgs": first}, open("expected.json", "w"))
