import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """The row maximum first, then the last position holding it (one comparison pass, no index reduction)."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        m = x.max(dim=-1, keepdim=True).values
        idx = torch.arange(x.shape[-1], device=x.device).expand_as(x)
        return torch.where(x == m, idx, -1).max(dim=-1).values
