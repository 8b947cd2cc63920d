import torch
import torch.nn as nn


class Model(nn.Module):
    """3x3 convolution, padding 1, with bias."""

    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1)

    def forward(self, x):
        return self.conv(x)


batch_size = 2
in_channels = 3
out_channels = 8
height = 12
width = 12


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels]
