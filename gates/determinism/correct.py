"""determinism, correct control: a split row sum whose partial sums are combined in a fixed order.
Also holds the reference and inputs factory."""

import torch

SPLIT = 16


def make_inputs(seed, shape=None, dtype=torch.float32, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(shape or (4, 256), generator=gen, dtype=torch.float64) + 0.5
    return (x.to(dtype=dtype, device=device),)


def reference(x):
    return x.sum(dim=-1)


def rowsum_split_fixed(x):
    """Partial sums over blocks of SPLIT columns, added in block order."""
    total = torch.zeros(x.shape[:-1], dtype=x.dtype, device=x.device)
    for block in torch.arange(x.shape[-1], device=x.device).split(SPLIT):
        total = total + x[..., block].sum(dim=-1)
    return total
