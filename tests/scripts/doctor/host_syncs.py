"""Plants a device-to-host sync every step on a GPU: the loss read with .item() each step."""
import torch

torch.manual_seed(0)
model = torch.nn.Linear(64, 1).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(256, 64, device="cuda")
total = 0.0
for step in range(30):
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    total += loss.item()  # a sync every step
print("mean loss", total / 30)
