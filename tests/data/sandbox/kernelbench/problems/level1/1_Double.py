import torch
import torch.nn as nn


class Model(nn.Module):
    """Doubles a (batch_size, dim) tensor."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


batch_size = 4
dim = 8


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
