import torch.nn as nn


class ModelNew(nn.Module):
    """Softmax that reuses the input as scratch for the exponentials (no temporary allocation)."""

    def forward(self, x):
        x.sub_(x.amax(dim=-1, keepdim=True)).exp_()
        return x / x.sum(dim=-1, keepdim=True)
