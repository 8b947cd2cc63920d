import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Clamp that skips the copy when nothing is out of range (the common case)."""

    def forward(self, x):
        if bool(((x >= -10.0) & (x <= 10.0)).all()):
            return x
        return torch.clamp(x, -10.0, 10.0)
