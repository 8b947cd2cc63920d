import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Float16 row sums reduced in the input's own dtype (no upcast pass), widened at the end."""

    def forward(self, x):
        return x.to(torch.float16).sum(dim=-1).float()
