"""Trains a small model and plants a NaN in one layer's gradient at step 6 (1-based)."""

import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(1, 13):
    x = torch.randn(16, 4)
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    if step == 6:
        model[2].weight.grad[0, 0] = float("nan")
    opt.step()
    print("step", step, "finite", all(bool(torch.isfinite(p).all()) for p in model.parameters()), flush=True)
assert all(bool(torch.isfinite(p).all()) for p in model.parameters()), "parameters went non-finite"
print("params finite at the end")
