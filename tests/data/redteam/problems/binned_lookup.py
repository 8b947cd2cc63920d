import torch
import torch.nn as nn


class Model(nn.Module):
    """Piecewise-constant learned activation: each value is mapped to its bin among uniformly spaced
    boundaries (torch.bucketize, right=False) and replaced by that bin's learned value."""

    def __init__(self, num_boundaries, low, high):
        super().__init__()
        step = (high - low) / (num_boundaries - 1)
        self.register_buffer("boundaries", low + step * torch.arange(num_boundaries, dtype=torch.float32))
        self.table = nn.Parameter(torch.randn(num_boundaries + 1))

    def forward(self, x):
        return self.table[torch.bucketize(x, self.boundaries)]


rows = 32
cols = 64
num_boundaries = 33
low = -4.0
high = 4.0


def get_inputs():
    return [torch.randn(rows, cols) * 1.5]


def get_init_inputs():
    return [num_boundaries, low, high]
