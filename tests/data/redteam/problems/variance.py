import torch
import torch.nn as nn


class Model(nn.Module):
    """Unbiased variance of each row."""

    def forward(self, x):
        return torch.var(x, dim=-1)


batch_size = 8
dim = 128


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
