import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """The RMS as a scaled 2-norm (the products divided by their largest magnitude first, so that no square
    overflows or underflows at any size); zero maps and maps holding an infinity or a NaN take the plain formula,
    whose 0/0 and inf/inf are the reference's."""

    def __init__(self, rows, cols):
        super().__init__()
        self.gain = nn.Parameter(1.0 + 0.5 * torch.randn(rows, cols))

    def forward(self, x):
        y = self.gain * x
        big = y.abs().amax()
        usable = torch.isfinite(big) & (big > 0)
        scale = torch.where(usable, big, torch.ones_like(big))
        rms = scale * (y / scale).pow(2).mean().sqrt()
        return y / torch.where(usable, rms, y.pow(2).mean().sqrt())
