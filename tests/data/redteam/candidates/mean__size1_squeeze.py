import torch.nn as nn


class ModelNew(nn.Module):
    """Row mean as sum / n, with the one-column case short-circuited (the mean of one value is itself)."""

    def forward(self, x):
        if x.shape[-1] == 1:
            return x.squeeze(-1)
        return x.sum(dim=-1) / x.shape[-1]
