import math

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Rank by counting instead of two sorts: the rank of x_i is the number of row elements strictly
    below it (an all-pairs compare, one tile of rows at a time, which maps onto tensor-core-free SIMT
    code with no data-dependent control flow). NaN is compared as +inf so it ranks last."""

    ROWS = 16

    def forward(self, x):
        key = torch.nan_to_num(x, nan=math.inf, posinf=math.inf, neginf=-math.inf)
        flat = key.reshape(-1, x.shape[-1])
        out = torch.empty(flat.shape, dtype=x.dtype, device=x.device)
        for r in range(0, flat.shape[0], self.ROWS):
            k = flat[r:r + self.ROWS]
            out[r:r + self.ROWS] = (k.unsqueeze(-2) < k.unsqueeze(-1)).sum(dim=-1).to(x.dtype)
        return out.reshape(x.shape)
