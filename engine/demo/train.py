"""Train a small character-level GPT on the bundled corpus.

A plain PyTorch script in the spirit of nanoGPT that runs with `python train.py`. It uses
one optional call of ptdash's: its loop starts at `ptdash.start_step()` (0 without
ptdash), so a run resumed from a checkpoint continues exactly where the saved one was.
Sized so that it visibly learns within a minute on two CPU cores: the loss falls from
about 4.2 (uniform over the vocabulary) to below 2.5.
"""

import argparse
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

import ptdash

CORPUS = Path(__file__).with_name("corpus.txt")


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention where each position sees only itself and the past."""

    def __init__(self, n_embd, n_head):
        super().__init__()
        assert n_embd % n_head == 0, "n_embd must be divisible by n_head"
        self.n_head = n_head
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        # (B, T, C) -> (B, n_head, T, head_size)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    """Pre-norm transformer block: attention then MLP, each on a residual branch."""

    def __init__(self, n_embd, n_head):
        super().__init__()
        self.ln1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head)
        self.ln2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token + position embeddings, a stack of blocks, and a head tied to the token embedding."""

    def __init__(self, vocab_size, block_size, n_layer, n_embd, n_head):
        super().__init__()
        self.block_size = block_size
        self.tok_emb = nn.Embedding(vocab_size, n_embd)
        self.pos_emb = nn.Embedding(block_size, n_embd)
        self.blocks = nn.Sequential(*[Block(n_embd, n_head) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight  # weight tying: fewer parameters, learns faster
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module):
        # Small normal init as in GPT-2; PyTorch's default init makes the first steps noisy.
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx, targets=None):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.blocks(self.tok_emb(idx) + self.pos_emb(pos))
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())

    @torch.no_grad()
    def generate(self, idx, n_new, generator):
        """Append `n_new` sampled tokens to `idx`, feeding back at most `block_size` of context."""
        for _ in range(n_new):
            logits, _ = self(idx[:, -self.block_size:])
            probs = F.softmax(logits[:, -1].float(), dim=-1)
            idx = torch.cat([idx, torch.multinomial(probs, 1, generator=generator)], dim=1)
        return idx


def get_batch(data, batch_size, block_size, generator):
    """Random windows of `data` and the same windows shifted by one character (the targets)."""
    ix = torch.randint(len(data) - block_size - 1, (batch_size,), generator=generator)
    x = torch.stack([data[i:i + block_size] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + block_size] for i in ix])
    return x, y


@torch.no_grad()
def evaluate(model, data, args, device, autocast, n_batches=8):
    """Mean loss over a fixed set of validation batches, so successive evals compare."""
    model.eval()
    g = torch.Generator().manual_seed(args.seed)
    losses = []
    for _ in range(n_batches):
        x, y = get_batch(data, args.batch_size, args.block_size, g)
        with autocast:
            losses.append(model(x.to(device), y.to(device))[1])
    model.train()
    return torch.stack(losses).mean().item()  # .item() is a CPU-GPU sync; only at eval time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=2000, help="optimizer steps")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--block-size", type=int, default=64, help="context length in characters")
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=64)
    p.add_argument("--lr", type=float, default=6e-3, help="peak learning rate of the one-cycle schedule")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--log-every", type=int, default=10, help="print the training loss every N steps")
    p.add_argument("--eval-every", type=int, default=200, help="print val loss and a sample every N steps (0: never)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    torch.set_float32_matmul_precision("high")  # lets CUDA use TF32 matmuls
    # bf16 autocast only on CUDA: on CPU it is slower than fp32 for a model this small.
    autocast = torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")

    text = CORPUS.read_text(encoding="ascii")
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
    n_train = int(0.9 * len(data))
    train_data, val_data = data[:n_train], data[n_train:]

    model = GPT(len(chars), args.block_size, args.n_layer, args.n_embd, args.n_head).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"corpus {len(text):,} chars | vocab {len(chars)} | model {n_params / 1e6:.2f}M params | device {device}")

    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1, betas=(0.9, 0.95))
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=args.lr, total_steps=args.steps, pct_start=0.1)
    sample_gen = torch.Generator(device=device).manual_seed(args.seed)

    start = ptdash.start_step()  # the step a resumed run continues after (0 for a new one)
    t0, t0_step = time.perf_counter(), start
    for step in range(start + 1, args.steps + 1):
        # Each batch depends only on (seed, step), so any step's batch can be reproduced,
        # including after a resume, without carrying RNG state around.
        g = torch.Generator().manual_seed(args.seed * 1_000_003 + step)
        x, y = get_batch(train_data, args.batch_size, args.block_size, g)
        with autocast:
            _, loss = model(x.to(device), y.to(device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()

        if step % args.log_every == 0 or step == args.steps:
            lr = optimizer.param_groups[0]["lr"]
            # .item() waits for the GPU to finish the step; done only on logging steps.
            loss_value = loss.item()
            ms = 1000 * (time.perf_counter() - t0) / (step - t0_step)
            print(f"step {step} | loss {loss_value:.4f} | lr {lr:.1e} | {ms:.0f} ms/step", flush=True)
            t0, t0_step = time.perf_counter(), step
        if args.eval_every and (step % args.eval_every == 0 or step == args.steps):
            print(f"eval step {step} | val loss {evaluate(model, val_data, args, device, autocast):.4f}", flush=True)
            prompt = torch.tensor([[stoi["\n"]]], device=device)
            with autocast:
                out = model.generate(prompt, 80, sample_gen)[0, 1:].tolist()
            print("sample | " + "".join(chars[i] for i in out).replace("\n", " / "), flush=True)
            t0, t0_step = time.perf_counter(), step  # keep eval time out of the ms/step figure

    print(f"done | final train loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
