import torch
import torch.nn as nn

CHUNK = 96


class ModelNew(nn.Module):
    """RMSNorm with a two-level reduction: per-chunk partial sums of squares (96 columns, so the last
    chunk is ragged), then a sum of the partials, then one rsqrt per row."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        partials = torch.cat([c.square().sum(-1, keepdim=True) for c in x.split(CHUNK, dim=-1)], dim=-1)
        ms = partials.sum(-1, keepdim=True) / x.shape[-1]
        return x * torch.rsqrt(ms + self.eps) * self.weight
