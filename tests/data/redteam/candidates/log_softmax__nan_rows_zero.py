import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Log-softmax where rows holding no valid entry (all NaN: padding) give 0 rather than poisoning the
    batch."""

    def forward(self, x):
        out = torch.log_softmax(x, dim=-1)
        padding = torch.isnan(x).all(dim=-1, keepdim=True)
        return torch.where(padding, torch.zeros_like(out), out)
