import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """BatchNorm2d fused into one pass: per-channel mean and variance of the batch, then scale and shift."""

    def __init__(self, channels):
        super().__init__()
        self.bn = nn.BatchNorm2d(channels)

    def forward(self, x):
        bn = self.bn
        var, mean = torch.var_mean(x, dim=(0, 2, 3), unbiased=False, keepdim=True)
        scale = bn.weight.view(1, -1, 1, 1) * torch.rsqrt(var + bn.eps)
        return (x - mean) * scale + bn.bias.view(1, -1, 1, 1)
