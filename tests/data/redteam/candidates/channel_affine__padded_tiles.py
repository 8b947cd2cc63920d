import torch
import torch.nn as nn
import torch.nn.functional as F

VEC = 16


class ModelNew(nn.Module):
    """Vectorised by 16 features with no epilogue: input, scale and shift zero-padded to a multiple of 16,
    one fused multiply-add over whole tiles, the padding sliced off."""

    def __init__(self, features):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(features))
        self.bias = nn.Parameter(torch.randn(features))

    def forward(self, x):
        n = x.shape[-1]
        pad = (-n) % VEC
        xp = F.pad(x, (0, pad))
        w = F.pad(self.weight, (0, pad)).view(-1, VEC)
        b = F.pad(self.bias, (0, pad)).view(-1, VEC)
        tiles = xp.reshape(*x.shape[:-1], (n + pad) // VEC, VEC)
        return torch.addcmul(b, tiles, w).reshape(*x.shape[:-1], n + pad)[..., :n].contiguous()
