"""An LSTM language model trained on sequence-first ``(T, B)`` batches, in the style of
pytorch/examples/word_language_model: ``nn.LSTM(batch_first=False)``, a decoder over the
vocabulary, truncated hidden state of zeros per batch. Batches come from a DataLoader whose
``collate_fn`` stacks samples along dimension 1, so every tensor is time-major.

The corpus is synthetic: each sequence counts upward modulo the vocabulary with a
per-sequence stride, so the next token is predictable from the previous two.
"""
import argparse
import math

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class CountingSequences(Dataset):
    def __init__(self, num_sequences, seq_len, vocab_size, seed):
        g = torch.Generator().manual_seed(seed)
        starts = torch.randint(0, vocab_size, (num_sequences, 1), generator=g)
        strides = torch.randint(1, 4, (num_sequences, 1), generator=g)
        self.tokens = (starts + strides * torch.arange(seq_len + 1)) % vocab_size

    def __len__(self):
        return len(self.tokens)

    def __getitem__(self, i):
        seq = self.tokens[i]
        return seq[:-1], seq[1:]


def collate_time_major(batch):
    """Stack (input, target) pairs into (T, B) tensors."""
    inputs, targets = zip(*batch)
    return torch.stack(inputs, dim=1), torch.stack(targets, dim=1)


class RNNModel(nn.Module):
    def __init__(self, ntoken, ninp, nhid, nlayers, dropout=0.2):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout, batch_first=False)
        self.decoder = nn.Linear(nhid, ntoken)
        self.nhid, self.nlayers = nhid, nlayers

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))  # (T, B, ninp)
        output, hidden = self.rnn(emb, hidden)  # (T, B, nhid)
        return self.decoder(self.drop(output)), hidden  # (T, B, ntoken)

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        return (weight.new_zeros(self.nlayers, bsz, self.nhid), weight.new_zeros(self.nlayers, bsz, self.nhid))


def evaluate(model, loader, criterion, ntokens):
    model.eval()
    total_loss, total_tokens = 0.0, 0
    with torch.no_grad():
        for data, targets in loader:
            output, _ = model(data, model.init_hidden(data.size(1)))
            total_loss += criterion(output.view(-1, ntokens), targets.reshape(-1)).item() * targets.numel()
            total_tokens += targets.numel()
    model.train()
    return total_loss / total_tokens


def main():
    parser = argparse.ArgumentParser(description="Sequence-first LSTM language model")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16, help="B of each (T, B) batch")
    parser.add_argument("--bptt", type=int, default=20, help="sequence length T")
    parser.add_argument("--vocab", type=int, default=20)
    parser.add_argument("--emsize", type=int, default=16)
    parser.add_argument("--nhid", type=int, default=32)
    parser.add_argument("--nlayers", type=int, default=2)
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--clip", type=float, default=0.25, help="gradient clipping")
    parser.add_argument("--log-interval", type=int, default=10, help="report interval in batches")
    parser.add_argument("--seed", type=int, default=1111)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    train_data = CountingSequences(640, args.bptt, args.vocab, seed=args.seed)
    val_data = CountingSequences(128, args.bptt, args.vocab, seed=args.seed + 1)
    train_loader = DataLoader(train_data, batch_size=args.batch_size, shuffle=True, collate_fn=collate_time_major)
    val_loader = DataLoader(val_data, batch_size=args.batch_size, collate_fn=collate_time_major)

    model = RNNModel(args.vocab, args.emsize, args.nhid, args.nlayers)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

    for epoch in range(1, args.epochs + 1):
        total_loss = 0.0
        for batch, (data, targets) in enumerate(train_loader, start=1):
            assert data.shape[0] == args.bptt, "sequence-first batches"
            optimizer.zero_grad()
            output, _ = model(data, model.init_hidden(data.size(1)))
            loss = criterion(output.view(-1, args.vocab), targets.reshape(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            optimizer.step()
            total_loss += loss.item()
            if batch % args.log_interval == 0:
                cur_loss = total_loss / args.log_interval
                print(f"| epoch {epoch:3d} | {batch:5d}/{len(train_loader):5d} batches | "
                      f"loss {cur_loss:5.2f} | ppl {math.exp(cur_loss):8.2f}")
                total_loss = 0.0
        val_loss = evaluate(model, val_loader, criterion, args.vocab)
        print("-" * 89)
        print(f"| end of epoch {epoch:3d} | valid loss {val_loss:5.2f} | valid ppl {math.exp(val_loss):8.2f}")
        print("-" * 89)
    print("done")


if __name__ == "__main__":
    main()
