import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Prefix sum that addresses the input through its storage and strides (what a kernel given the
    storage pointer and the strides sees)."""

    def forward(self, x):
        base = torch.empty(0, dtype=x.dtype, device=x.device).set_(x.untyped_storage())
        view = base.as_strided(x.shape, x.stride(), 0)
        return torch.cumsum(view, dim=-1)
