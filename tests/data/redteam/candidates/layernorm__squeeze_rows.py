import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """LayerNorm on the rows of a squeezed 2-D view."""

    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        rows = x.squeeze()
        mean = rows.mean(dim=-1, keepdim=True)
        var = ((rows - mean) ** 2).mean(dim=-1, keepdim=True)
        return (rows - mean) * torch.rsqrt(var + self.norm.eps) * self.norm.weight + self.norm.bias
