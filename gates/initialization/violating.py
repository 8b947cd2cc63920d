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


def softmax_blocked_whole_rows_only(x):
    """The same, in whole blocks of 8 rows: every declared shape has a multiple of 8 rows, so the outputs
    there are written in full, and only a batch of another size (1, a prime) leaves its last rows unwritten.
    The shapes gate alone would see what that memory held as a small numeric error, another at every call;
    the initialization gate judges the shapes gate's first edge shapes too."""
    m = x.amax(dim=-1, keepdim=True)
    s = torch.exp(x - m).sum(dim=-1, keepdim=True)
    out = torch.empty_like(x)
    rows = x.shape[0]
    for start in range(0, rows - rows % BLOCK, BLOCK):
        out[start:start + BLOCK] = torch.exp(x[start:start + BLOCK] - m[start:start + BLOCK]) / s[start:start + BLOCK]
    return out
