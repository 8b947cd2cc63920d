"""distributions, correct control: SiLU and softplus written with care for every magnitude.

Also holds the references and the inputs factory that the distributions controls share."""

import torch
import torch.nn.functional as F


def make_inputs(seed, shape=None, dtype=torch.float32, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape or (8, 256), generator=gen, dtype=torch.float64) * 2
    return (x.to(dtype=dtype, device=device),)


def silu_reference(x):
    return F.silu(x)


def softplus_reference(x):
    return F.softplus(x)


def silu(x):
    """x * sigmoid(x): subnormals stay subnormal, huge magnitudes saturate correctly."""
    return x * torch.sigmoid(x)


def softplus(x):
    """log(1 + exp(x)) without overflow: x + log1p(exp(-|x|)) for positive x, log1p(exp(x)) otherwise."""
    return torch.clamp_min(x, 0) + torch.log1p(torch.exp(-x.abs()))
