import torch
import torch.nn as nn


class Model(nn.Module):
    """Two-layer MLP with an exact (erf) GELU."""

    def __init__(self, in_features, hidden, out_features):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, out_features)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


batch_size = 8
in_features = 32
hidden = 64
out_features = 16


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, hidden, out_features]
