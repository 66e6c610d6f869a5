"""An unmodified training loop (argparse, a DataLoader, SGD with momentum, a cosine schedule)
whose data holds a bad batch: ``--bad wild`` multiplies the inputs of batch ``--at`` by 10,000
(finite values, as a bad shard gives), ``--bad inf`` puts an inf in it. Prints the loss of
each 10th step and the final loss and whether the parameters are finite."""
import argparse
import math

import torch
from torch.utils.data import DataLoader, Dataset

p = argparse.ArgumentParser()
p.add_argument("--bad", choices=("wild", "inf", "none"), default="wild")
p.add_argument("--at", type=int, nargs="+", default=[80], help="the bad batches")
p.add_argument("--steps", type=int, default=200)
args = p.parse_args()


class Data(Dataset):
    def __len__(self):
        return args.steps * 16

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(8, generator=g)
        if i // 16 in args.at:
            if args.bad == "wild":
                x = x * 10000.0
            elif args.bad == "inf" and i % 16 == 0:
                x[0] = math.inf
        return x, x[:4].sum().unsqueeze(0) * 0.5


torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps)
loss = None
for step, (x, y) in enumerate(DataLoader(Data(), batch_size=16, shuffle=False)):
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    sched.step()
    if step % 10 == 0:
        print(f"step {step} loss {loss.item():.4g}", flush=True)
# The loss of the final parameters over a clean batch.
g = torch.Generator().manual_seed(12345)
x = torch.randn(256, 8, generator=g)
with torch.no_grad():
    final = torch.nn.functional.mse_loss(model(x), x[:, :4].sum(1, keepdim=True) * 0.5).item()
finite = all(bool(torch.isfinite(q).all()) for q in model.parameters())
print(f"final loss {final:.6g} params finite {finite}", flush=True)
