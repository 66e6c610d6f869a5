"""Plants a param group whose learning rate is 0, and a loss that cannot improve: a fixed
batch of pure-noise targets fitted with a learning rate too small to move it."""
import torch

torch.manual_seed(0)
x, y = torch.randn(256, 8), torch.randn(256, 1)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD([{"params": [model.weight], "lr": 1e-5}, {"params": [model.bias], "lr": 0.0}])
for step in range(600):
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
