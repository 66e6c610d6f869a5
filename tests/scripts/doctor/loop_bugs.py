"""Plants, in one loop that do not interfere: gradients never cleared, training in eval
mode, an unused layer and a frozen parameter in the optimizer, nn.DataParallel, a
DistributedSampler without set_epoch and a Python warning; then dies of an in-place
modification that autograd needed."""
import warnings

import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 128), nn.ReLU(), nn.Dropout(0.1), nn.Linear(128, 128), nn.ReLU())
        self.head = nn.Linear(128, 1)
        self.unused = nn.Linear(128, 128)  # never called: never gets a gradient
        self.scale = nn.Parameter(torch.ones(1), requires_grad=False)  # frozen, yet given to the optimizer

    def forward(self, x):
        return self.head(self.body(x)) * self.scale


torch.manual_seed(0)
data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
sampler = DistributedSampler(data, num_replicas=1, rank=0, shuffle=True)
loader = DataLoader(data, batch_size=8, sampler=sampler)
model = nn.DataParallel(Net())
model.eval()
opt = torch.optim.SGD(model.parameters(), lr=1e-4)
step = 0
for epoch in range(7):
    for x, y in loader:  # no sampler.set_epoch(epoch)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()  # no zero_grad anywhere
        opt.step()
        step += 1
        if step == 3:
            warnings.warn("planted warning from the script")
print("trained", step, "steps", flush=True)
h = torch.randn(4, requires_grad=True)
y = h.sigmoid()
y.mul_(2)
y.sum().backward()
