import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Correct: two-pass variance; the mean from a Kahan-compensated sum over blocks of 32 columns, then the
    sum of squared deviations, divided by n - 1."""

    BLOCK = 32

    def forward(self, x):
        n = x.shape[-1]
        total = torch.zeros(x.shape[:-1], dtype=x.dtype, device=x.device)
        comp = torch.zeros_like(total)
        for j in range(0, n, self.BLOCK):
            y = x[..., j:j + self.BLOCK].sum(dim=-1) - comp
            t = total + y
            comp = (t - total) - y
            total = t
        mean = (total / n).unsqueeze(-1)
        d = x - mean
        return (d * d).sum(dim=-1) / (n - 1)
