import torch
import torch.nn as nn
import torch.nn.functional as F

BLOCK = 64


class ModelNew(nn.Module):
    """Two-stage top-k: rows padded with -inf to whole 64-wide blocks (the block count written out, so an
    empty batch reshapes too), per-block top-k candidates, then a top-k over the candidates. The padding can
    only ever tie with a genuine -inf, so values are exact."""

    def __init__(self, k):
        super().__init__()
        self.k = k

    def forward(self, x):
        n = x.shape[-1]
        pad = (-n) % BLOCK
        if pad:
            x = F.pad(x, (0, pad), value=float("-inf"))
        blocks = x.reshape(*x.shape[:-1], x.shape[-1] // BLOCK, BLOCK)
        cand = torch.topk(blocks, min(self.k, BLOCK), dim=-1).values
        return torch.topk(cand.flatten(-2), self.k, dim=-1).values
