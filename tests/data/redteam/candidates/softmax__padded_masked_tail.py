import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    """Correct: rows padded with -inf to a multiple of 32 (what a masked vector load gives), two-pass
    softmax over the padded tile, padding dropped: the padding adds exp(-inf) = 0 to every sum."""

    BLOCK = 32

    def forward(self, x):
        n = x.shape[-1]
        pad = (-n) % self.BLOCK
        xp = F.pad(x, (0, pad), value=float("-inf")) if pad else x
        m = xp.amax(dim=-1, keepdim=True)
        e = torch.exp(xp - m)
        return (e / e.sum(dim=-1, keepdim=True))[..., :n].contiguous()
