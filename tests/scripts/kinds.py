"""One steady training loop of each shape ptdash supports, for the command-by-script-kind
tests (tests/integration/test_control_matrix.py). It knows nothing of ptdash.

--kind one       one torch.optim.SGD
--kind several   two SGD optimizers, one per network, both stepped every iteration (actor-critic)
--kind manual    no optimizer: model.zero_grad(), backward(), p -= lr * p.grad (the tutorials)
--kind closure   SGD.step(closure), as Lightning steps every optimizer
--kind lbfgs     LBFGS(max_iter=1).step(closure)
--kind trainer   a Trainer class shaped like HF's: it builds its own optimizer and warm-up
                 schedule, sets each group's LR itself every step (nanoGPT), accumulates two
                 micro-batches and clips with clip_grad_norm_ at a norm that never bites
--kind ddp       one SGD under DistributedDataParallel (gloo): run it with --nproc-per-node 2

Each step appends one line to --trace (rank R writes --trace with .R appended under DDP):
the step, then for each optimizer (or the manual update) the LR its update used and the
norm of the gradient it used (after any clipping). The LR is measured from the update
itself, |dtheta| / |g| (plain SGD: the update is lr * g); LBFGS's direction is not the
gradient, so for it the LR is the one its param group holds inside its step (read in
the closure). Data depends only on the step.
"""
import argparse
import time

import torch
import torch.nn as nn

p = argparse.ArgumentParser()
p.add_argument("--kind", required=True, choices=("one", "several", "manual", "closure", "lbfgs", "trainer", "ddp"))
p.add_argument("--steps", type=int, default=100000)
p.add_argument("--sleep", type=float, default=0.01)
p.add_argument("--lr", type=float, default=0.01)
p.add_argument("--trace", required=True)
args = p.parse_args()

rank = 0
if args.kind == "ddp":
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    args.trace += f".{rank}"
torch.manual_seed(0)


def net() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))


def batch(step: int, part: int = 0):
    g = torch.Generator().manual_seed(step * 100 + part * 10 + rank)
    x = torch.randn(32, 8, generator=g) * 10
    return x, x.sum(1, keepdim=True)


def flat(ps) -> torch.Tensor:
    return torch.cat([q.detach().reshape(-1) for q in ps])


def observed(params, before: torch.Tensor) -> tuple[float, float]:
    """(|dtheta| / |g|, |g|) of the update just made, g being the gradients it used."""
    g = flat([q.grad for q in params]).norm().item()
    return (flat(params) - before).norm().item() / g, g


class Trainer:
    """Shaped like transformers.Trainer: owns the optimizer, the schedule and the loop."""

    def __init__(self, model, lr, warmup=20, accumulation=2, max_grad_norm=1e3):
        self.model, self.lr, self.warmup = model, lr, warmup
        self.accumulation, self.max_grad_norm = accumulation, max_grad_norm
        self.optimizer = torch.optim.SGD(model.parameters(), lr=lr)

    def lr_at(self, step):
        return self.lr * min(1.0, (step + 1) / self.warmup)

    def training_step(self, step):
        for part in range(self.accumulation):
            x, y = batch(step, part)
            (nn.functional.mse_loss(self.model(x), y) / self.accumulation).backward()
        nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr_at(step)
        before = flat(self.model.parameters())
        self.optimizer.step()
        out = observed(list(self.model.parameters()), before)
        self.optimizer.zero_grad(set_to_none=True)
        return out


trace = open(args.trace, "a")
model = net()
if args.kind == "ddp":
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(model)
params = list(model.parameters())
if args.kind == "several":
    critic = net()
    opts = [torch.optim.SGD(params, lr=args.lr), torch.optim.SGD(critic.parameters(), lr=args.lr / 2)]
elif args.kind == "lbfgs":
    opts = [torch.optim.LBFGS(params, lr=args.lr, max_iter=1)]
elif args.kind in ("one", "closure", "ddp"):
    opts = [torch.optim.SGD(params, lr=args.lr)]
trainer = Trainer(model, args.lr) if args.kind == "trainer" else None
try:
    for step in range(args.steps):
        x, y = batch(step)
        if args.kind == "manual":
            loss = nn.functional.mse_loss(model(x), y)
            model.zero_grad()
            loss.backward()
            before = flat(params)
            with torch.no_grad():
                for q in params:
                    q -= args.lr * q.grad
            cols = observed(params, before)
        elif args.kind == "several":
            loss = nn.functional.mse_loss(model(x), y) + nn.functional.mse_loss(critic(x), -y)
            for opt in opts:
                opt.zero_grad()
            loss.backward()
            cols = ()
            for opt in opts:
                ps = opt.param_groups[0]["params"]
                before = flat(ps)
                opt.step()
                cols += observed(ps, before)
        elif args.kind in ("closure", "lbfgs"):
            opt, seen = opts[0], []

            def closure():
                opt.zero_grad()
                loss = nn.functional.mse_loss(model(x), y)
                loss.backward()
                seen.append(opt.param_groups[0]["lr"])
                return loss

            before = flat(params)
            opt.step(closure)
            lr_used, g = observed(params, before)
            cols = (seen[0] if args.kind == "lbfgs" else lr_used, g)
        elif args.kind == "trainer":
            cols = trainer.training_step(step)
        else:
            loss = nn.functional.mse_loss(model(x), y)
            opts[0].zero_grad()
            loss.backward()
            before = flat(params)
            opts[0].step()
            cols = observed(params, before)
        trace.write(" ".join([str(step + 1), *(f"{v:.9g}" for v in cols)]) + "\n")
        trace.flush()
        time.sleep(args.sleep)
finally:
    trace.close()
    print(f"rank {rank} finally ran", flush=True)
    if args.kind == "ddp":
        dist.destroy_process_group()
