import torch
import torch.nn as nn
from torch.nn.utils.parametrizations import weight_norm


class Model(nn.Module):
    """Linear layer with weight normalisation: W = g * v / ||v|| (per output row), y = x W^T + b."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.fc = weight_norm(nn.Linear(in_features, out_features))

    def forward(self, x):
        return self.fc(x)


batch_size = 32
in_features = 64
out_features = 32


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
