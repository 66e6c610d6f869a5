"""A model whose steps become fast mid-run, then slow again, for the cost budget.

300 small extra parameters with (constant) gradients make the per-layer norm pass cost
several times the step's compute, so a fast step cannot afford it every step; a slow
step (30 ms of sleep) can. The phases end on what the engine decided, not on time:

1. 100 slow steps;
2. fast steps until the budget samples one step in more than one, then 400 more;
3. slow steps until it samples every step again, then 20 more.

Prints each phase's last step and the sampling period in force.
"""

import time

import torch

import ptdash.engine

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
extra = [torch.nn.Parameter(torch.zeros(4)) for _ in range(300)]
for p in extra:
    p.grad = torch.zeros(4)
opt = torch.optim.SGD(list(model.parameters()) + extra, lr=0.01, foreach=True)
x = torch.randn(16, 4)
step = 0


def train(slow: bool) -> None:
    global step
    loss = model(x).pow(2).mean()
    opt.zero_grad(set_to_none=False)
    loss.backward()
    opt.step()
    step += 1
    if slow:
        time.sleep(0.03)


def budget():
    return ptdash.engine.ENGINE.budget


for _ in range(100):
    train(slow=True)
print("slow until", step, "every", budget().every, flush=True)
for _ in range(200_000):
    train(slow=False)
    if budget().every > 1:
        break
thinned = step
for _ in range(400):
    train(slow=False)
print("fast thinned at", thinned, "until", step, "every", budget().every, flush=True)
for _ in range(2_000):
    train(slow=True)
    if budget().every == 1:
        break
dense = step
for _ in range(20):
    train(slow=True)
print("slow again dense at", dense, "until", step, "every", budget().every, flush=True)
