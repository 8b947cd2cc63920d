"""distributions, violating controls: right on normal-looking inputs, wrong at the extremes."""

import torch


def silu_flush_subnormals(x):
    """SiLU as a kernel compiled with fast-math computes it: subnormal inputs and results are flushed
    to zero (FTZ/DAZ), so tiny activations vanish where the reference keeps them."""
    tiny = torch.finfo(x.dtype).tiny
    x = torch.where(x.abs() < tiny, torch.zeros_like(x), x)
    out = x * torch.sigmoid(x)
    return torch.where(out.abs() < tiny, torch.zeros_like(out), out)


def softplus_clamped(x):
    """Softplus that clamps its input "to avoid overflow in exp": exact for ordinary inputs, but every
    input above 80 comes out as 80, where the truth is the input itself."""
    return torch.log1p(torch.exp(x.clamp(max=80.0)))
