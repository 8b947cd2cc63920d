import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    """Float16 row sums by a pairwise tree (log2(n) rounds of adjacent pairs added), all in half precision."""

    def forward(self, x):
        h = x.to(torch.float16)
        while h.shape[-1] > 1:
            if h.shape[-1] % 2:
                h = F.pad(h, (0, 1))
            h = h[..., 0::2] + h[..., 1::2]
        return h.squeeze(-1).float() if h.shape[-1] == 1 else h.sum(dim=-1).float()
