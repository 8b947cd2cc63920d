import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Row argmax with NaN treated as the smallest value (a reduction whose comparison skips NaN)."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.argmax(torch.nan_to_num(x, nan=-float("inf")), dim=-1)
