import torch
import torch.nn as nn


class Model(nn.Module):
    """Group normalization (channels split into groups, statistics per sample and group) with a
    per-channel affine."""

    def __init__(self, num_groups, num_channels):
        super().__init__()
        self.gn = nn.GroupNorm(num_groups, num_channels, eps=1e-5)

    def forward(self, x):
        return self.gn(x)


batch_size = 2
channels = 32
groups = 8
height = 16
width = 16


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return [groups, channels]
