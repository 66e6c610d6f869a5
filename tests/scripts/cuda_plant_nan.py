"""CUDA loop with a NaN planted in one gradient at step 20; then trains on for a while."""
import time

import torch

model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(1, 400):
    loss = model(torch.randn(32, 64, device="cuda")).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    if step == 20:
        model[2].weight.grad[0, 0] = float("nan")
    opt.step()
    time.sleep(0.01)
