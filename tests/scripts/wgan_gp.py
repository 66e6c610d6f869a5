"""WGAN-GP on 2-D points, shaped like the public WGAN-GP scripts (Gulrajani et al.'s toy
experiments, eriklindernoren/PyTorch-GAN's wgan_gp.py): a critic and a generator, Adam with
betas (0.5, 0.9) each, ``--n-critic`` critic steps per generator step, and a gradient penalty
through ``torch.autograd.grad(create_graph=True)``. The critic's loss is a negative distance
estimate plus the penalty: it changes sign, swings and drifts as the generator learns.
Prints ``iter N d_loss D g_loss G`` every 50 iterations and ``done``."""
import argparse
import math

import torch
import torch.nn as nn

p = argparse.ArgumentParser()
p.add_argument("--iters", type=int, default=300)
p.add_argument("--n-critic", type=int, default=5)
p.add_argument("--batch-size", type=int, default=64)
p.add_argument("--lambda-gp", type=float, default=10.0)
p.add_argument("--lr", type=float, default=1e-4)
p.add_argument("--seed", type=int, default=0)
args = p.parse_args()


def real_batch(n, g):
    """Eight Gaussians on a ring of radius 2."""
    k = torch.randint(0, 8, (n,), generator=g).float() * (2 * math.pi / 8)
    centers = torch.stack([k.cos(), k.sin()], 1) * 2.0
    return centers + 0.05 * torch.randn(n, 2, generator=g)


def gradient_penalty(critic, real, fake, g):
    eps = torch.rand(real.size(0), 1, generator=g)
    mixed = (eps * real + (1 - eps) * fake).requires_grad_(True)
    out = critic(mixed)
    grads = torch.autograd.grad(out, mixed, grad_outputs=torch.ones_like(out), create_graph=True)[0]
    return ((grads.norm(2, dim=1) - 1) ** 2).mean()


def main():
    torch.manual_seed(args.seed)
    g = torch.Generator().manual_seed(args.seed)
    generator = nn.Sequential(nn.Linear(2, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))
    critic = nn.Sequential(nn.Linear(2, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    opt_c = torch.optim.Adam(critic.parameters(), lr=args.lr, betas=(0.5, 0.9))
    opt_g = torch.optim.Adam(generator.parameters(), lr=args.lr, betas=(0.5, 0.9))
    for it in range(args.iters):
        for _ in range(args.n_critic):
            real = real_batch(args.batch_size, g)
            fake = generator(torch.randn(args.batch_size, 2, generator=g)).detach()
            d_loss = critic(fake).mean() - critic(real).mean() + args.lambda_gp * gradient_penalty(critic, real, fake, g)
            opt_c.zero_grad()
            d_loss.backward()
            opt_c.step()
        g_loss = -critic(generator(torch.randn(args.batch_size, 2, generator=g))).mean()
        opt_g.zero_grad()
        g_loss.backward()
        opt_g.step()
        if it % 50 == 0:
            print(f"iter {it} d_loss {d_loss.item():.4g} g_loss {g_loss.item():.4g}", flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    main()
