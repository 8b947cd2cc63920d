import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Top-k by k rounds of selection (row max, then knock that element out), which beats a full sort
    for small k. NaNs are mapped to -inf first so that every comparison in the rounds is well ordered."""

    def __init__(self, k):
        super().__init__()
        self.k = k

    def forward(self, x):
        work = torch.nan_to_num(x, nan=float("-inf"), posinf=float("inf"), neginf=float("-inf")).clone()
        picked = []
        for _ in range(self.k):
            val, pos = work.max(dim=-1, keepdim=True)
            picked.append(val)
            work.scatter_(-1, pos, float("-inf"))
        return torch.cat(picked, dim=-1)
