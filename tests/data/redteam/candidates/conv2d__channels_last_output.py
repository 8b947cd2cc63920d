import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Convolution on the NHWC fast path (channels-last activations and weight)."""

    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1)

    def forward(self, x):
        x = x.contiguous(memory_format=torch.channels_last)
        w = self.conv.weight.contiguous(memory_format=torch.channels_last)
        return torch.nn.functional.conv2d(x, w, self.conv.bias, padding=1)
