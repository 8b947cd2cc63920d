import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Correct: blocked scan; each block of 16 columns (the last one may be short) scanned on its own, then
    the carry (the last prefix so far) added."""

    BLOCK = 16

    def forward(self, x):
        n = x.shape[-1]
        out = torch.empty_like(x)
        carry = torch.zeros(x.shape[:-1] + (1,), dtype=x.dtype, device=x.device)
        for j in range(0, n, self.BLOCK):
            part = torch.cumsum(x[..., j:j + self.BLOCK], dim=-1) + carry
            out[..., j:j + self.BLOCK] = part
            carry = part[..., -1:]
        return out
