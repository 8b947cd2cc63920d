import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Softplus computed in float32 registers whatever the storage type (one code path for half,
    bfloat16 and float32 inputs), with the threshold select."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        xf = x.float()
        return torch.where(xf > 20, xf, torch.log1p(torch.exp(xf)))
