"""Two gloo ranks that print their own validation metrics: rank R prints, at steps 5, 10, 15
and 20, ``rank R | val_loss=<R + step / 100>``; nothing waits for the relay (each rank's output
is marked with its own steps, engine/outmarks.py).

Launched by ptdash (``--nproc-per-node 2``), or with ``--spawn`` started by the script
itself (``mp.spawn``; the main process only spawns and joins)."""
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP


def train(rank: int, world: int, port: int | None) -> None:
    if port is None:
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(1, 21):
        opt.zero_grad()
        model(torch.randn(8, 4)).sum().backward()
        opt.step()
        if step % 5 == 0:
            line = f"rank {rank} | val_loss={rank + step / 100}"
            sys.stdout.write(line + "\n")  # one write: the ranks' lines never interleave in output.log
            sys.stdout.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    if "--spawn" in sys.argv:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.spawn(train, args=(2, port), nprocs=2)
    else:
        train(0, 0, None)
