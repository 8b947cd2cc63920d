import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    """Correct: convolution as im2col (unfold) + one matmul + bias, reading the live weight every call."""

    def __init__(self, in_channels, out_channels):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1)

    def forward(self, x):
        w = self.conv.weight
        cols = F.unfold(x, 3, padding=1)
        out = w.reshape(w.shape[0], -1) @ cols + self.conv.bias.view(1, -1, 1)
        return out.reshape(x.shape[0], w.shape[0], x.shape[2], x.shape[3])
