import torch
import torch.nn as nn


class Model(nn.Module):
    """InstanceNorm1d with affine parameters and running statistics (used in eval mode)."""

    def __init__(self, num_features):
        super().__init__()
        self.norm = nn.InstanceNorm1d(num_features, affine=True, track_running_stats=True)

    def forward(self, x):
        return self.norm(x)


batch_size = 8
num_features = 16
length = 64


def get_inputs():
    return [torch.randn(batch_size, num_features, length)]


def get_init_inputs():
    return [num_features]
