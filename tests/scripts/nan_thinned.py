"""Plants a NaN on a step the cost budget does not sample (``--on-anomaly skip``).

``loss``: the loss of that step is NaN (its gradients too); ``grad``: only one layer's
gradient is (the loss is finite). Fast steps over 300 extra parameters make the budget
thin first; the planted step is chosen from the period in force, not by time. Prints the
planted step, and after each later step whether the parameters are finite.
"""

import sys

import torch

import ptdash.engine

what = sys.argv[1]
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
extra = [torch.nn.Parameter(torch.zeros(4)) for _ in range(300)]
for p in extra:
    p.grad = torch.zeros(4)
opt = torch.optim.SGD(list(model.parameters()) + extra, lr=0.01, foreach=True)
x = torch.randn(16, 4)


def finite() -> bool:
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())


def budget():
    return ptdash.engine.ENGINE.budget


step, planted = 0, None
while step < 200_000:
    step += 1
    every = budget().every
    # Plant once thinned, on a step that neither the period in force nor the next one samples.
    plant = planted is None and every >= 4 and step > 100 and step % every not in (0, every - 1)
    loss = model(x).pow(2).mean()
    if plant and what == "loss":
        loss = loss * float("nan")
    opt.zero_grad(set_to_none=False)
    loss.backward()
    if plant and what == "grad":
        model[2].weight.grad[0, 0] = float("nan")
    opt.step()
    if plant:
        planted = step
        print("planted at", step, "every", every, flush=True)
    if planted is not None:
        print("step", step, "finite", finite(), flush=True)
        if step >= planted + 3:
            break
