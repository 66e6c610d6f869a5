"""Dies the way a too-large batch dies on a GPU."""
import torch

model = torch.nn.Linear(4, 4)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
