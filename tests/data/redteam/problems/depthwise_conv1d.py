import torch
import torch.nn as nn


class Model(nn.Module):
    """Depthwise 1-D convolution (one filter per channel, 'same' padding) with bias."""

    def __init__(self, channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv1d(channels, channels, kernel_size, padding=kernel_size // 2, groups=channels)

    def forward(self, x):
        return self.conv(x)


batch_size = 4
channels = 16
length = 64
kernel_size = 5


def get_inputs():
    return [torch.randn(batch_size, channels, length)]


def get_init_inputs():
    return [channels, kernel_size]
