"""A job that hangs at step --at on rank --rank (gloo under torchrun, or one process alone).

--hang python: that rank spins in a Python loop (``wait_for_lost_shard``);
--hang data: its DataLoader worker blocks, so it waits in the loader's queue;
--hang collective: it skips the metric all_reduce the other ranks make, and waits in a barrier;
--hang gil: it runs a regular expression that backtracks for minutes, in C, holding the GIL;
--hang lock: a thread of the script's (``prefetch``) takes a lock and keeps it --for seconds,
while the training thread waits for it (``wait_for_prefetch``);
--hang none: no hang. Each step sleeps --sleep. --then raise: the spinning rank raises once its
--for seconds are over (a job that gives up waiting), instead of going on."""
import argparse
import os
import re
import threading
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

p = argparse.ArgumentParser()
p.add_argument("--hang", default="none", choices=("none", "python", "data", "collective", "gil", "lock"))
p.add_argument("--at", type=int, default=30)
p.add_argument("--rank", type=int, default=1)
p.add_argument("--steps", type=int, default=100000)
p.add_argument("--sleep", type=float, default=0.01)
p.add_argument("--for", dest="seconds", type=float, default=3600, help="how long the Python loop spins")
p.add_argument("--then", default="go", choices=("go", "raise"))
args = p.parse_args()

multi = "RANK" in os.environ
if multi:
    dist.init_process_group("gloo")
rank = dist.get_rank() if multi else 0
stuck = rank == args.rank and args.hang != "none"


class Batches(Dataset):
    def __len__(self):
        return args.steps

    def __getitem__(self, i):
        if stuck and args.hang == "data" and i == args.at - 1:
            time.sleep(3600)  # the worker never delivers this batch
        g = torch.Generator().manual_seed(i * 10 + rank)
        return torch.randn(8, generator=g)


def wait_for_lost_shard():
    deadline = time.monotonic() + args.seconds
    n = 0
    while time.monotonic() < deadline:
        n += 1  # a busy Python loop: the GIL changes hands every switch interval
    return n


def prefetch(lock, taken):
    with lock:
        taken.set()
        time.sleep(args.seconds)  # the next shard never comes; the lock is kept meanwhile


def wait_for_prefetch():
    lock, taken = threading.Lock(), threading.Event()
    threading.Thread(target=prefetch, args=(lock, taken), name="prefetch", daemon=True).start()
    taken.wait()
    with lock:  # the training thread waits here as long as the prefetcher keeps it
        pass


torch.manual_seed(0)
net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
model = nn.parallel.DistributedDataParallel(net) if multi else net
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(Batches(), batch_size=None, num_workers=1 if args.hang == "data" else 0)
for step, x in enumerate(loader, 1):
    if stuck and args.hang == "python" and step == args.at:
        wait_for_lost_shard()
        if args.then == "raise":
            raise TimeoutError("the lost shard never came")
    if stuck and args.hang == "lock" and step == args.at:
        wait_for_prefetch()
    if stuck and args.hang == "gil" and step == args.at:
        re.match(r"(a+)+$", "a" * 40 + "b")  # no Python frame runs, and no thread of this process
    loss = (model(x[None]) - x.sum()).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if multi:
        metric = loss.detach().clone()
        if stuck and args.hang == "collective" and step == args.at:
            dist.barrier()  # skipped the all_reduce below: the others wait in it
        else:
            dist.all_reduce(metric)
    time.sleep(args.sleep)
    if step >= args.steps:
        break
print(f"rank {rank} done", flush=True)
