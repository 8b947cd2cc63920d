import torch
import torch.nn as nn

ROWS_PER_TILE = 8


class ModelNew(nn.Module):
    """RMSNorm processed in tiles of 8 rows (one tile per program, as the kernel's grid would launch),
    each tile writing its rows straight into a preallocated output."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        flat = x.reshape(-1, x.shape[-1])
        out = torch.empty_like(flat)
        n_tiles = flat.shape[0] // ROWS_PER_TILE
        for t in range(n_tiles):
            rows = slice(t * ROWS_PER_TILE, (t + 1) * ROWS_PER_TILE)
            tile = flat[rows]
            inv = torch.rsqrt(tile.square().mean(-1, keepdim=True) + self.eps)
            out[rows] = tile * inv * self.weight
        return out.view(x.shape)
