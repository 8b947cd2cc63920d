import torch.nn as nn


class ModelNew(nn.Module):
    """Matmul that loads B as a row-major K x N tile (B's leading dimension is its width)."""

    def forward(self, a, b):
        k, n = b.shape
        b_tile = b.as_strided((k, n), (n, 1))
        return a @ b_tile
