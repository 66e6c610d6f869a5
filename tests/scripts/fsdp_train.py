"""An FSDP training loop for 2-rank tests (gloo, CPU): FSDP2 (``fully_shard``), FSDP1
(``FullyShardedDataParallel``, use_orig_params as scripts use it) or, for comparison, a
plain replica of the same model. Each batch depends only on the step and the rank, and the
loop starts at ``ptdash.start_step()``, so a resumed run sees the batches an uninterrupted
one would.

Options: ``--wrap fsdp2|fsdp1|none``, ``--clip X`` (the script's own clip: torch.nn.utils.clip_grad_norm_, FSDP1's method under fsdp1),
``--checkpointing`` (activation checkpointing of each block), ``--steps N``, ``--sleep S``.
Each rank writes ``S L`` lines (step and loss as an exact float hex) to losses-<rank>.txt
and its full final parameters to params-<rank>.pt, and prints ``rank R finally ran``.
"""
import argparse
import time

import torch
import torch.distributed as dist
from torch.utils.checkpoint import checkpoint

try:
    import ptdash
    start_step = ptdash.start_step
except ImportError:  # plain python
    def start_step():
        return 0

p = argparse.ArgumentParser()
p.add_argument("--wrap", choices=["fsdp2", "fsdp1", "none"], default="fsdp2")
p.add_argument("--clip", type=float, default=None)
p.add_argument("--checkpointing", action="store_true")
p.add_argument("--steps", type=int, default=100000)
p.add_argument("--sleep", type=float, default=0.0)
args = p.parse_args()


class Block(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(width, width)

    def forward(self, x):
        if args.checkpointing:
            return x + checkpoint(lambda h: torch.tanh(self.fc(h)), x, use_reentrant=False)
        return x + torch.tanh(self.fc(x))


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(8, 16)
        self.blocks = torch.nn.ModuleList(Block(16) for _ in range(2))
        self.out = torch.nn.Linear(16, 1)

    def forward(self, x):
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.out(h)


dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
net = Net()
if args.wrap == "fsdp2":
    from torch.distributed.fsdp import fully_shard
    for block in net.blocks:
        fully_shard(block)
    model = fully_shard(net)
elif args.wrap == "fsdp1":
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    model = FSDP(net, auto_wrap_policy=ModuleWrapPolicy({Block}), use_orig_params=True, device_id=torch.device("cpu"))
else:
    model = net
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.9)
losses = []
try:
    for step in range(start_step(), args.steps):
        g = torch.Generator().manual_seed(step * 10 + rank)
        x = torch.randn(16, 8, generator=g)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        if args.wrap == "none" and world > 1:  # the plain replica averages as FSDP's reduce-scatter does
            for param in model.parameters():
                dist.all_reduce(param.grad)
                param.grad /= world
        if args.clip is not None and args.wrap == "fsdp1":  # FSDP1's own: the local shards' norms, reduced
            model.clip_grad_norm_(args.clip)
        elif args.clip is not None:  # on DTensor gradients, torch's reduces the shards' norms itself
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        sched.step()
        losses.append(f"{step + 1} {loss.item().hex()}\n")
        if args.sleep:
            time.sleep(args.sleep)
finally:
    if args.wrap == "fsdp2":
        state = {k: v.full_tensor() for k, v in model.state_dict().items()}
    elif args.wrap == "fsdp1":
        from torch.distributed.fsdp import FullStateDictConfig, StateDictType
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT,
                                  FullStateDictConfig(offload_to_cpu=False, rank0_only=False)):
            state = model.state_dict()
    else:
        state = model.state_dict()
    torch.save({k: v.detach().clone() for k, v in state.items()}, f"params-{rank}.pt")
    with open(f"losses-{rank}.txt", "a") as f:  # a resumed run adds its steps
        f.writelines(losses)
    print(f"rank {rank} finally ran", flush=True)
    dist.destroy_process_group()
