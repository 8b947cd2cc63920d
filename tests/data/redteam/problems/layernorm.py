import torch
import torch.nn as nn


class Model(nn.Module):
    """LayerNorm over the last dimension, with learned weight and bias."""

    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        return self.norm(x)


batch_size = 8
dim = 64


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return [dim]
