import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Row mean with denormal inputs flushed to zero first (denormals take a slow path on many CPUs)."""

    def forward(self, x):
        tiny = torch.finfo(x.dtype).tiny
        x = torch.where(x.abs() < tiny, torch.zeros_like(x), x)
        return x.sum(dim=-1) / x.shape[-1]
