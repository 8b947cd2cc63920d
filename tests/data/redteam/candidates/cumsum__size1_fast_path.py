import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Prefix sum, with the trivial one-column case short-circuited (the scan of one element is itself)."""

    def forward(self, x):
        if x.shape[-1] == 1:
            return x
        return torch.cumsum(x, dim=-1)
