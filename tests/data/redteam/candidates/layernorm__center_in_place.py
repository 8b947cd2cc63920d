import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """LayerNorm that centres the activations in place (saves one temporary of the input's size)."""

    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        x -= x.mean(dim=-1, keepdim=True)
        var = (x * x).mean(dim=-1, keepdim=True)
        return x * torch.rsqrt(var + self.norm.eps) * self.norm.weight + self.norm.bias
