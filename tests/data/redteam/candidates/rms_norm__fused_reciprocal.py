import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """RMSNorm with one square root per row: the row RMS is computed once, the weight is divided by it
    (one broadcast division instead of an rsqrt and two multiplies), and eps guards that division."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        rms = x.square().mean(-1, keepdim=True).sqrt()
        return x * (self.weight / (rms + self.eps))
