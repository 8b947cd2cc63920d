import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Rank with one sort instead of two: the argsort of a permutation is its inverse, so after one
    stable argsort the ranks are written with a single scatter (rank[perm[j]] = j)."""

    def forward(self, x):
        perm = torch.argsort(x, dim=-1, stable=True)
        pos = torch.arange(x.shape[-1], device=x.device).expand_as(perm)
        return torch.empty_like(perm).scatter_(-1, perm, pos).to(x.dtype)
