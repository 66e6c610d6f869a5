"""A steady training loop for control tests: data depends only on the step, each step
sleeps a little so commands land mid-run. Prints 'finally ran' on the way out."""
import argparse
import time

import torch

import ptdash

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=100000)
p.add_argument("--sleep", type=float, default=0.01)
p.add_argument("--clip", type=float, default=None)
p.add_argument("--lr", type=float, default=0.05)
p.add_argument("--params-out", default=None)
p.add_argument("--grad-norm-out", default=None, help="append each step's post-update gradient norm")
p.add_argument("--watch", action="store_true", help="name the model and optimizer with ptdash.watch")
p.add_argument("--width", type=int, default=16)
args = p.parse_args()

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, args.width), torch.nn.Tanh(), torch.nn.Linear(args.width, 1))
opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + 0.001 * s))
if args.watch:
    ptdash.watch(model=model, optimizer=opt, scheduler=sched)
norms = open(args.grad_norm_out, "a") if args.grad_norm_out else None
try:
    for step in range(ptdash.start_step(), args.steps):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(32, 8, generator=g) * 10
        y = x.sum(1, keepdim=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        if args.clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        sched.step()
        if norms:
            # The gradients the update used (ptdash clips them in place before the step).
            norms.write(f"{step + 1} {torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]).item()}\n")
            norms.flush()
        time.sleep(args.sleep)
finally:
    print("finally ran", flush=True)
    if args.params_out:
        torch.save({k: v.clone() for k, v in model.state_dict().items()}, args.params_out)
