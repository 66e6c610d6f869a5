"""GradScaler on CPU with a huge initial scale, so the first steps overflow and are skipped.

Writes the unscaled loss of every iteration whose optimizer step was taken.
"""
import json

import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 127, growth_interval=1000)
taken = []
for step in range(30):
    x = torch.randn(16, 8)
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
    before = scaler.get_scale()
    scaler.step(opt)
    scaler.update()
    if scaler.get_scale() >= before:  # the scale only drops when the step was skipped
        taken.append(loss.item())
json.dump(taken, open("taken.json", "w"))
print("skipped", 30 - len(taken))
