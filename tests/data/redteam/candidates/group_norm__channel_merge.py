import math

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Group norm from per-channel statistics: every (sample, channel) plane gets a two-pass mean and
    M2 (one block per plane), and the channels of a group are merged with Chan's formula
    (M2 = sum M2_c + HW * sum (mean_c - mean)^2), so no block ever reduces over a whole group."""

    def __init__(self, num_groups, num_channels):
        super().__init__()
        self.gn = nn.GroupNorm(num_groups, num_channels, eps=1e-5)

    def forward(self, x):
        n, c = x.shape[0], x.shape[1]
        g = self.gn.num_groups
        hw = math.prod(x.shape[2:])
        planes = x.reshape(n, c, hw)
        cmean = planes.mean(dim=-1, keepdim=True)
        cm2 = (planes - cmean).square().sum(dim=-1)                  # (n, c)
        cmean = cmean.squeeze(-1).reshape(n, g, c // g)
        cm2 = cm2.reshape(n, g, c // g)
        gmean = cmean.mean(dim=-1, keepdim=True)                      # equal counts per channel
        m2 = cm2.sum(dim=-1, keepdim=True) + hw * (cmean - gmean).square().sum(dim=-1, keepdim=True)
        var = m2 / ((c // g) * hw)
        rstd = torch.rsqrt(var + self.gn.eps)
        xg = x.reshape(n, g, (c // g) * hw)
        y = ((xg - gmean) * rstd).reshape(x.shape)
        shape = (1, c) + (1,) * (x.dim() - 2)
        return y * self.gn.weight.reshape(shape) + self.gn.bias.reshape(shape)
