import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Row mean from float32 partial sums of 32 columns added into a float16 accumulator."""

    SPLIT = 32

    def forward(self, x):
        n = x.shape[-1]
        acc = torch.zeros(x.shape[:-1], dtype=torch.float16, device=x.device)
        for j in range(0, n, self.SPLIT):
            acc = (acc.float() + x[..., j:j + self.SPLIT].sum(dim=-1)).to(torch.float16)
        return acc.to(x.dtype) / n
