import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """Overflow-free softplus in float32 registers for half storage: the input widened once, max(x, 0) +
    log1p(exp(-|x|)) (exp never sees a positive argument) and x itself above the threshold, as the reference;
    the result rounded back to the input's dtype."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        stable = torch.clamp_min(xf, 0) + torch.log1p(torch.exp(-xf.abs()))
        return torch.where(xf > 20, xf, stable).to(x.dtype)
