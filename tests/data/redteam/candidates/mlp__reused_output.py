import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    """MLP writing its result into one preallocated output buffer (no allocation on the hot path)."""

    def __init__(self, in_features, hidden, out_features):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, out_features)
        self._out = None

    def forward(self, x):
        h = F.gelu(self.fc1(x))
        shape = (x.shape[0], self.fc2.out_features)
        if self._out is None or self._out.shape != shape or self._out.dtype != x.dtype:
            self._out = torch.empty(shape, dtype=x.dtype, device=x.device)
        return torch.addmm(self.fc2.bias, h, self.fc2.weight.t(), out=self._out)
