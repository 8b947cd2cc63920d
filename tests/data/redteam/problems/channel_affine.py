import torch
import torch.nn as nn


class Model(nn.Module):
    """A learned per-feature scale and shift: x * weight + bias over the last dimension."""

    def __init__(self, features):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(features))
        self.bias = nn.Parameter(torch.randn(features))

    def forward(self, x):
        return x * self.weight + self.bias


batch_size = 16
features = 1024


def get_inputs():
    return [torch.randn(batch_size, features)]


def get_init_inputs():
    return [features]
