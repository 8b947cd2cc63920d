import torch
import torch.nn as nn
import torch.nn.functional as F

BLOCK = 64


class ModelNew(nn.Module):
    """Two-stage top-k: every 64-wide block of a row yields its own top-k candidates (rows padded up to
    a whole number of blocks), then one top-k over the candidates. Work per row is small and parallel."""

    def __init__(self, k):
        super().__init__()
        self.k = k

    def forward(self, x):
        n = x.shape[-1]
        pad = (-n) % BLOCK
        if pad:
            x = F.pad(x, (0, pad))
        blocks = x.reshape(*x.shape[:-1], -1, BLOCK)
        cand = torch.topk(blocks, min(self.k, BLOCK), dim=-1).values
        return torch.topk(cand.flatten(-2), self.k, dim=-1).values
