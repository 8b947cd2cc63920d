import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Scan along the contiguous dimension: transpose once, scan columns, hand back the transposed view."""

    def forward(self, x):
        xt = x.transpose(-1, -2).contiguous()
        return torch.cumsum(xt, dim=-2).transpose(-1, -2)
