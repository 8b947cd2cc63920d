import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Matmul into one of four preallocated output buffers, used in turn (a small workspace pool)."""

    def __init__(self):
        super().__init__()
        self.pool = {}
        self.turn = 0

    def forward(self, a, b):
        key = (a.shape[0], b.shape[1], a.dtype, a.device)
        bufs = self.pool.setdefault(key, [torch.empty(a.shape[0], b.shape[1], dtype=a.dtype, device=a.device)
                                          for _ in range(4)])
        out = bufs[self.turn % 4]
        self.turn += 1
        return torch.mm(a, b, out=out)
