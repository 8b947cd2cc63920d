import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Rank with a sample sort: 15 splitters per row are sampled at random positions, every value is
    bucketed against them (equal values always share a bucket), the buckets are laid out in order
    with a stable counting pass and sorted stably inside, and the rank is the inverse of the resulting
    permutation. Random splitters keep the buckets balanced for any input distribution."""

    SPLITTERS = 15

    def forward(self, x):
        n = x.shape[-1]
        if n == 0 or x.numel() == 0:
            return torch.empty(x.shape, dtype=x.dtype, device=x.device)
        pick = torch.randint(0, n, x.shape[:-1] + (self.SPLITTERS,), device=x.device)
        splitters = torch.gather(x, -1, pick).sort(dim=-1).values
        bucket = torch.searchsorted(splitters.contiguous(), x.contiguous())
        by_bucket = torch.argsort(bucket, dim=-1, stable=True)
        inner = torch.argsort(torch.gather(x, -1, by_bucket), dim=-1, stable=True)
        perm = torch.gather(by_bucket, -1, inner)
        pos = torch.arange(n, device=x.device).expand_as(perm)
        return torch.empty_like(perm).scatter_(-1, perm, pos).to(x.dtype)
