"""special_values, CUDA controls: RMSNorm written as its formula, x / sqrt(mean(x^2) + eps) * w, judged against
`F.rms_norm`. With one +Inf in a row the formula gives 0 at the row's finite elements and NaN at the Inf, as
torch's CPU path does; torch's CUDA rms_norm computes its statistics with the LayerNorm kernel's Welford update,
which turns the Inf into NaN for the whole row. The oracle runs on the kernel's device: the gate asks the
CPU's evaluation too and accepts a class either gives (correct). A kernel that zeroes its non-finite results
gives 0 where both evaluations give NaN (violating)."""

import torch
import torch.nn.functional as F

EPS = 1e-6


def make_inputs(seed, shape=None, dtype=torch.float32, device="cuda"):
    gen = torch.Generator().manual_seed(seed)
    rows, cols = shape or (8, 256)
    x = torch.randn(rows, cols, generator=gen, dtype=torch.float64)
    w = 1 + torch.randn(cols, generator=gen, dtype=torch.float64) / 8
    return (x.to(dtype=dtype, device=device), w.to(dtype=dtype, device=device))


def reference(x, w):
    return F.rms_norm(x, (x.shape[-1],), w, EPS)


def rms_norm_formula(x, w):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * w.float()).to(x.dtype)


def rms_norm_nan_to_num(x, w):
    """The formula with its non-finite results zeroed: a NaN where every evaluation of the reference gives NaN
    (at the Inf itself) comes out as 0."""
    return torch.nan_to_num(rms_norm_formula(x, w), nan=0.0, posinf=0.0, neginf=0.0)
