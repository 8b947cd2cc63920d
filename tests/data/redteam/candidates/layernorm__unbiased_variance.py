import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """LayerNorm with torch.var_mean for the statistics (one fused reduction)."""

    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        var, mean = torch.var_mean(x, dim=-1, keepdim=True)
        return (x - mean) * torch.rsqrt(var + self.norm.eps) * self.norm.weight + self.norm.bias
