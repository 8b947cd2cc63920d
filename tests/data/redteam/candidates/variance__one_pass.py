import torch.nn as nn


class ModelNew(nn.Module):
    """Variance in one pass over the data: sum and sum of squares together."""

    def forward(self, x):
        n = x.shape[-1]
        s = x.sum(dim=-1)
        sq = (x * x).sum(dim=-1)
        return (sq - s * s / n) / (n - 1)
