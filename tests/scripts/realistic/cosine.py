"""Step-based training with ``CosineAnnealingLR(T_max=steps)`` stepped every iteration,
the schedule of many transformer and self-supervised repos, on a small regression.
"""
import argparse

import torch
import torch.nn as nn


def main():
    parser = argparse.ArgumentParser(description="CosineAnnealingLR over a fixed number of steps")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--weight-decay", type=float, default=1e-4)
    parser.add_argument("--log-every", type=int, default=25)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    data_gen = torch.Generator().manual_seed(args.seed)
    true_w = torch.randn(16, 1, generator=data_gen)

    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps)

    for step in range(1, args.steps + 1):
        x = torch.randn(args.batch_size, 16, generator=data_gen)
        y = x @ true_w + 0.1 * torch.randn(args.batch_size, 1, generator=data_gen)
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        if step % args.log_every == 0 or step == 1:
            print(f"step {step:4d} loss {loss.item():.5f} lr {scheduler.get_last_lr()[0]:.3e}")
    print("done")


if __name__ == "__main__":
    main()
