import torch
import torch.nn as nn

BLOCK = 128


class ModelNew(nn.Module):
    """Row L2 norm in 128-wide blocks: each block's sum of squares is computed in float32, and the
    per-row running total across blocks is carried at the input's width (one register lane per row)
    before the final float32 square root."""

    def forward(self, x):
        acc = torch.promote_types(x.dtype, torch.float32)
        total = torch.zeros(x.shape[:-1], dtype=x.dtype, device=x.device)
        for blk in x.split(BLOCK, dim=-1):
            part = blk.to(acc).square().sum(dim=-1)
            total = (total.to(acc) + part).to(x.dtype)
        return total.to(acc).sqrt()
