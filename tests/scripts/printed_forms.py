"""Prints its metrics in every form scripts print (k=v and k: v, a metric word's value, a
Python dict, a JSON line, a tqdm bar redrawn with carriage returns, a Keras line, a table
row) beside what is no metric (counters, rates, percentages, dates, versions, paths, lr),
and writes what it printed at each step to ``argv[1]`` as JSON.

Nothing waits for the relay: each report is kept at the step it was printed at by the
marks in the output (engine/outmarks.py), however late the relay reads it.
"""
import json
import sys

import torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(16, 4), torch.randn(16, 1)
print("torch 2.13.0 | run 2026-12-03 15:40:02 | checkpoint to ckpt/resnet50-epoch=3.ckpt | lr 0.01", flush=True)
expected = {}
for step in range(1, 21):
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    v = round(1.0 / step, 4)
    form = step % 5
    if form == 1:
        print(f"epoch {step // 5} | step {step} | train loss {v} | val_loss={v + 1} acc: {v / 2} | 12.5ms/step",
              flush=True)
        expected[step] = {"train_loss": v, "val_loss": v + 1, "acc": v / 2}
    elif form == 2:
        print({"eval_loss": v + 2, "eval_accuracy": 0.5, "eval_runtime": 1.5, "epoch": step / 5}, flush=True)
        print(json.dumps({"test_f1": v + 3, "step": step, "learning_rate": 0.01}), flush=True)
        expected[step] = {"eval_loss": v + 2, "eval_accuracy": 0.5, "test_f1": v + 3}
    elif form == 3:
        for n in range(1, 5):  # tqdm: the bar redrawn in place, its postfix's k=v pairs
            sys.stderr.write(f"\r{n * 25:3d}%|{'#' * n}| {n}/4 [00:0{n}<00:00, 9.1it/s, val_mse={v + n}, top1=0.{n}]")
            sys.stderr.flush()
        sys.stderr.write("\n")
        expected[step] = {"val_mse": v + 4, "top1": 0.4}
    elif form == 4:
        print(f"8/8 - 0s - 3ms/step - loss: {v + 5} - val_rmse: {v + 6}", flush=True)
        expected[step] = {"loss": v + 5, "val_rmse": v + 6}
    else:
        print(f"| step {step} | valid loss {v + 7} | valid acc {v + 8} | 240.1 samples/s |", flush=True)
        expected[step] = {"valid_loss": v + 7, "valid_acc": v + 8}
    print(f"done {step}", flush=True)
with open(sys.argv[1], "w") as f:
    json.dump(expected, f)
