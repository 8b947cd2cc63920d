import torch
import torch.nn as nn
import torch.nn.functional as F

TILE = 128


class ModelNew(nn.Module):
    """Output columns in tiles of 128 (one GEMM per tile, the tile's bias fused), the ragged last columns
    as one more, narrower GEMM."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        w, b = self.linear.weight, self.linear.bias
        n = w.shape[0]
        full = n - n % TILE
        parts = [F.linear(x, w[j:j + TILE], b[j:j + TILE]) for j in range(0, full, TILE)]
        if full < n:  # the ragged tile
            parts.append(F.linear(x, w[full:], b[:n - full]))
        return torch.cat(parts, dim=-1)
