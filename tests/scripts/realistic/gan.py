"""A tiny GAN on 2-D points, shaped like pytorch/examples/dcgan and the GAN tutorials:
a Generator and a Discriminator, one Adam optimizer each with its own learning rate,
and per iteration a discriminator step on real and fake points followed by a generator step.

By default the discriminator loss is one ``d_loss.backward()``; ``--dcgan-style`` calls
backward on the real and the fake halves separately before ``opt_d.step()``, as the
DCGAN example does.
"""
import argparse
import math

import torch
import torch.nn as nn


class Generator(nn.Module):
    def __init__(self, nz, hidden):
        super().__init__()
        self.main = nn.Sequential(nn.Linear(nz, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                  nn.Linear(hidden, 2))

    def forward(self, z):
        return self.main(z)


class Discriminator(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.main = nn.Sequential(nn.Linear(2, hidden), nn.LeakyReLU(0.2), nn.Linear(hidden, hidden),
                                  nn.LeakyReLU(0.2), nn.Linear(hidden, 1))

    def forward(self, x):
        return self.main(x).view(-1)


def sample_real(n, generator):
    """Points on a ring of radius 2 with a little noise."""
    angle = torch.rand(n, generator=generator) * 2 * math.pi
    ring = torch.stack([angle.cos(), angle.sin()], dim=1) * 2.0
    return ring + 0.05 * torch.randn(n, 2, generator=generator)


def main():
    parser = argparse.ArgumentParser(description="Tiny 2-D GAN")
    parser.add_argument("--steps", type=int, default=600, help="training iterations (default: 600)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--nz", type=int, default=4, help="size of the latent z vector")
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--lr-d", type=float, default=4e-4, help="discriminator learning rate")
    parser.add_argument("--lr-g", type=float, default=1e-4, help="generator learning rate")
    parser.add_argument("--beta1", type=float, default=0.5, help="beta1 for adam (default: 0.5)")
    parser.add_argument("--log-every", type=int, default=50)
    parser.add_argument("--dcgan-style", action="store_true",
                        help="backward the real and fake discriminator losses separately")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    data_gen = torch.Generator().manual_seed(args.seed + 1)

    netG = Generator(args.nz, args.hidden)
    netD = Discriminator(args.hidden)
    criterion = nn.BCEWithLogitsLoss()
    opt_d = torch.optim.Adam(netD.parameters(), lr=args.lr_d, betas=(args.beta1, 0.999))
    opt_g = torch.optim.Adam(netG.parameters(), lr=args.lr_g, betas=(args.beta1, 0.999))
    real_label = torch.ones(args.batch_size)
    fake_label = torch.zeros(args.batch_size)

    for step in range(1, args.steps + 1):
        # (1) Update D: maximize log(D(x)) + log(1 - D(G(z)))
        real = sample_real(args.batch_size, data_gen)
        noise = torch.randn(args.batch_size, args.nz)
        fake = netG(noise)
        opt_d.zero_grad()
        if args.dcgan_style:
            errD_real = criterion(netD(real), real_label)
            errD_real.backward()
            errD_fake = criterion(netD(fake.detach()), fake_label)
            errD_fake.backward()
            d_loss = errD_real + errD_fake
        else:
            d_loss = criterion(netD(real), real_label) + criterion(netD(fake.detach()), fake_label)
            d_loss.backward()
        opt_d.step()

        # (2) Update G: maximize log(D(G(z)))
        opt_g.zero_grad()
        g_loss = criterion(netD(fake), real_label)
        g_loss.backward()
        opt_g.step()

        if step % args.log_every == 0:
            print(f"[{step}/{args.steps}] Loss_D: {d_loss.item():.4f} Loss_G: {g_loss.item():.4f}")

    with torch.no_grad():
        radius = netG(torch.randn(1000, args.nz)).norm(dim=1)
    print(f"generated radius mean {radius.mean().item():.4f} std {radius.std().item():.4f} (real: 2.0)")
    print("done")


if __name__ == "__main__":
    main()
