import torch
import torch.nn as nn


class Model(nn.Module):
    """BatchNorm2d over (batch, channels, height, width), in training mode as constructed."""

    def __init__(self, channels):
        super().__init__()
        self.bn = nn.BatchNorm2d(channels)

    def forward(self, x):
        return self.bn(x)


batch_size = 8
channels = 16
height = 12
width = 12


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return [channels]
