import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """3x3 average pooling, stride 2, padding 1; padded positions are not counted in the divisor."""

    def forward(self, x):
        return F.avg_pool2d(x, kernel_size=3, stride=2, padding=1, count_include_pad=False)


batch_size = 2
channels = 4
height = 16
width = 16


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return []
