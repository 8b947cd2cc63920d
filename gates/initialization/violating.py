"""initialization, violating control: torch.empty, partly written."""

import torch

BLOCK = 8


def softmax_blocked_no_tail(x):
    """Writes the output in whole blocks of 8 columns (`range(0, n - n % BLOCK, BLOCK)`), as a kernel
    launched with `grid = n // BLOCK` does: the last n % 8 columns keep whatever the allocator's memory
    held, which is often a previous, plausible result of the same size."""
    m = x.amax(dim=-1, keepdim=True)
    s = torch.exp(x - m).sum(dim=-1, keepdim=True)
    out = torch.empty_like(x)
    n = x.shape[-1]
    for start in range(0, n - n % BLOCK, BLOCK):
        out[..., start:start + BLOCK] = torch.exp(x[..., start:start + BLOCK] - m) / s
    return out
