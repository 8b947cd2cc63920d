import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    """Convolution that sanitises its input in place first: negative zeros become +0 (a sign bit that
    reaches no output) and the rest is left alone."""

    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1)

    def forward(self, x):
        x.masked_fill_(x == 0, 0.0)
        return F.conv2d(x, self.conv.weight, self.conv.bias, padding=1)
