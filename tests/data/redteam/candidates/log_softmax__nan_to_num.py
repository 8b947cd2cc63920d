import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Log-softmax with non-finite results sanitised, so that a loss built on it stays finite."""

    def forward(self, x):
        m = x.amax(dim=-1, keepdim=True)
        z = x - m
        out = z - torch.log(torch.exp(z).sum(dim=-1, keepdim=True))
        return torch.nan_to_num(out, nan=0.0, posinf=0.0, neginf=-1e4)
