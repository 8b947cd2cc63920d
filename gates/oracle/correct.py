"""oracle, correct control: exact (erf) GELU. Also holds the reference and inputs factory."""

import math

import torch


def make_inputs(seed, shape=None, dtype=torch.float32, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape or (8, 64), generator=gen, dtype=torch.float64) * 2
    return (x.to(dtype=dtype, device=device),)


def reference(x):
    return torch.nn.functional.gelu(x)


def gelu_erf(x):
    """x * Phi(x) with the error function, as the reference defines it."""
    return 0.5 * x * (1.0 + torch.erf(x * (1.0 / math.sqrt(2.0))))
