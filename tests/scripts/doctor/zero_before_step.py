"""Plants zero_grad() between backward() and step(): every update sees no gradients."""
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(8):
    x = torch.randn(16, 8)
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.zero_grad()
    opt.step()
