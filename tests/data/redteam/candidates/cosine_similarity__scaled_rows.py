import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Cosine similarity with overflow-safe norms: every row is scaled by its largest magnitude before
    squaring (rows of zeros keep scale 1), the norm is rebuilt as scale * ||row / scale||, clamped at
    eps, and the normalised rows are multiplied and summed."""

    EPS = 1e-8

    def _norm(self, x):
        if x.shape[1] == 0:
            return x.new_zeros(x.shape[0], 1).clamp_min(self.EPS)
        s = x.abs().amax(dim=1, keepdim=True)                 # NaN and inf propagate through s
        s = torch.where(s == 0, torch.ones((), dtype=x.dtype, device=x.device), s)
        return (s * (x / s).square().sum(dim=1, keepdim=True).sqrt()).clamp_min(self.EPS)

    def forward(self, x1, x2):
        return ((x1 / self._norm(x1)) * (x2 / self._norm(x2))).sum(dim=1)
