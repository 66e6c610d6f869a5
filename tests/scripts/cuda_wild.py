"""A CUDA loop (SGD with momentum, a cosine schedule, data on the device) whose batch 100 is
10,000 times too large; it reads nothing back until its end, where it prints its final clean
loss and whether its parameters are finite."""
import torch

device = "cuda"
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
steps = 600
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
g = torch.Generator(device=device).manual_seed(0)
data = torch.randn(steps, 32, 64, device=device, generator=g)
for step in range(steps):
    x = data[step] * (10000.0 if step == 100 else 1.0)
    loss = torch.nn.functional.mse_loss(model(x), x[:, :8].sum(1, keepdim=True) * 0.25)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    sched.step()
x = torch.randn(512, 64, device=device, generator=g)
with torch.no_grad():
    final = torch.nn.functional.mse_loss(model(x), x[:, :8].sum(1, keepdim=True) * 0.25).item()
finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
print(f"final loss {final:.6g} params finite {finite}", flush=True)
