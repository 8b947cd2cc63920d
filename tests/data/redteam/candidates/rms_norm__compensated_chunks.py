import torch
import torch.nn as nn

CHUNK = 128


class ModelNew(nn.Module):
    """RMSNorm with the sum of squares accumulated over 128-column chunks using Kahan compensation,
    so the row statistic stays accurate for long rows."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        total = torch.zeros_like(x[..., :1])
        comp = torch.zeros_like(total)
        for chunk in x.split(CHUNK, dim=-1):
            y = chunk.square().sum(-1, keepdim=True) - comp
            t = total + y
            comp = (t - total) - y
            total = t
        ms = total / x.shape[-1]
        return x * torch.rsqrt(ms + self.eps) * self.weight
