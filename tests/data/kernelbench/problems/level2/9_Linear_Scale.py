import torch
import torch.nn as nn


class Model(nn.Module):
    """y = scale * (x W^T + b): weights come from the seeded construction."""

    def __init__(self, in_features, out_features, scale):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.scale = scale

    def forward(self, x):
        return self.linear(x) * self.scale


batch_size = 3
in_features = 8
out_features = 5
scale = 0.5


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, scale]
