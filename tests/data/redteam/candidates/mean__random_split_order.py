import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Split-K mean: partial sums of 32 columns combined in whatever order they finish (as atomic adds
    would), simulated by a random completion order."""

    SPLIT = 32

    def forward(self, x):
        n = x.shape[-1]
        acc = torch.zeros(x.shape[:-1], dtype=x.dtype, device=x.device)
        starts = list(range(0, n, self.SPLIT))
        for i in torch.randperm(len(starts)).tolist():
            acc += x[..., starts[i]:starts[i] + self.SPLIT].sum(dim=-1)
        return acc / n
