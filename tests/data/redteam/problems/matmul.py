import torch
import torch.nn as nn


class Model(nn.Module):
    """C = A @ B."""

    def forward(self, a, b):
        return torch.matmul(a, b)


M = 16
K = 64
N = 24


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N)]


def get_init_inputs():
    return []
