import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    """Row argmax in blocks of 32: each block's maximum and its index (the first among ties, a NaN's if the
    block holds one), then the first block holding the row's maximum; the tail padded with -inf."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        block = 32
        pad = (-x.shape[-1]) % block
        if pad:
            x = F.pad(x, (0, pad), value=float("-inf"))
        values, within = x.reshape(*x.shape[:-1], x.shape[-1] // block, block).max(dim=-1)
        blocks = torch.argmax(values, dim=-1, keepdim=True)
        return (blocks * block + within.gather(-1, blocks)).squeeze(-1)
