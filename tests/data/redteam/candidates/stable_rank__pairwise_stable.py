import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Sort-free rank by counting, tile of rows by tile: rank_i = #{j : x_j < x_i} + #{j < i : x_j == x_i},
    where NaN compares above every number and equal to NaN (sort's order) and -0.0 equals +0.0, so the
    count is exactly the position a stable sort gives."""

    ROWS = 16

    def forward(self, x):
        n = x.shape[-1]
        if x.numel() == 0:
            return torch.empty(x.shape, dtype=x.dtype, device=x.device)
        flat = x.reshape(-1, n)
        out = torch.empty(flat.shape, dtype=x.dtype, device=x.device)
        earlier = torch.ones(n, n, dtype=torch.bool, device=x.device).tril(diagonal=-1)  # [i, j]: j < i
        for r in range(0, flat.shape[0], self.ROWS):
            v = flat[r:r + self.ROWS]
            vi, vj = v.unsqueeze(-1), v.unsqueeze(-2)              # [.., i, 1], [.., 1, j]
            ni, nj = torch.isnan(vi), torch.isnan(vj)
            less = (vj < vi) | (ni & ~nj)
            equal = (vj == vi) | (ni & nj)
            out[r:r + self.ROWS] = (less | (equal & earlier)).sum(dim=-1).to(x.dtype)
        return out.reshape(x.shape)
