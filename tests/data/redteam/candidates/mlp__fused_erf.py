import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Correct: addmm for both layers and the exact GELU written out, 0.5 x (1 + erf(x / sqrt 2))."""

    def __init__(self, in_features, hidden, out_features):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, out_features)

    def forward(self, x):
        h = torch.addmm(self.fc1.bias, x, self.fc1.weight.t())
        h = 0.5 * h * (1.0 + torch.erf(h * 0.7071067811865476))
        return torch.addmm(self.fc2.bias, h, self.fc2.weight.t())
