"""A flood of output: every step writes a 6 KB dump (no metric) and a bar redrawn on
stderr, and every 25th step a validation line (``print``) and, straight to fd 1 past
Python's streams, ``raw_mse=...`` (as C code or a library writing to the fd would). At
1-2k steps a second the relay reads what was written several steps ago: each value must
still be stored at the step it was printed at.

``argv[1]``: steps; ``argv[2]``: where the script writes, in order, every byte it wrote
(output.log must hold exactly these); ``--own-stdout``: the script replaces sys.stdout by
a stream of its own on fd 1 (line-buffered), which ptdash's wrapper of sys.stdout does not see.
"""
import os
import sys

import torch

steps, expected = int(sys.argv[1]), sys.argv[2]
if "--own-stdout" in sys.argv:
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
torch.manual_seed(0)
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(4, 8)
dump = "".join(f"layer {i} weight mean {0.001 * i:.4f} std 0.98 shape [8, 8] grads ok\n" for i in range(96))
written = []
for step in range(1, steps + 1):
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
    bar = f"\r{step % 100:3d}%|##   | {step % 100}/100 [00:01<00:02, 900.1it/s]"
    sys.stderr.write(bar)
    sys.stdout.write(dump)
    written += [bar, dump]
    if step % 25 == 0:
        line = f"eval step {step} | val_loss={step + 0.5}\n"
        print(line, end="")
        raw = f"raw_mse={step + 0.25}\n"
        sys.stdout.flush()
        os.write(1, raw.encode())
        written += [line, raw]
sys.stdout.flush()
with open(expected, "w") as f:
    f.write("".join(written))
