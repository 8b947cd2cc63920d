import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """Element-wise Huber loss (no reduction)."""

    def __init__(self, delta):
        super().__init__()
        self.delta = delta

    def forward(self, pred, target):
        return F.huber_loss(pred, target, reduction="none", delta=self.delta)


rows = 64
cols = 64
delta = 0.5


def get_inputs():
    return [torch.randn(rows, cols), torch.randn(rows, cols)]


def get_init_inputs():
    return [delta]
