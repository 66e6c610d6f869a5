"""The network, in its own module as most projects keep it."""
import torch.nn as nn


class Regressor(nn.Module):
    def __init__(self, features: int, hidden: int):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(features, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU())
        self.head = nn.Linear(hidden, 1)

    def forward(self, x):
        return self.head(self.body(x))
