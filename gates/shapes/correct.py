"""shapes, correct control: row softmax that makes no assumption about the sizes it is given.

Also holds the reference and the inputs factory that the shapes controls share."""

import torch


def make_inputs(seed, shape=None, dtype=torch.float32, device="cpu"):
    """One (rows, cols) tensor of logits; `shape` is swept by the shapes gate."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape or (16, 1024), generator=gen, dtype=torch.float64) * 3
    return (x.to(dtype=dtype, device=device),)


def reference(x):
    return torch.softmax(x, dim=-1)


def softmax_rows(x):
    """Subtract the row maximum, exponentiate, normalise: correct for every size, empty included."""
    z = torch.exp(x - x.amax(dim=-1, keepdim=True))
    return z / z.sum(dim=-1, keepdim=True)
