"""shapes, violating controls: kernels that are right on the sizes they were tested on only."""

import torch

BLOCK = 128


def softmax_block128(x):
    """Processes whole blocks of 128 columns (`n // BLOCK * BLOCK`), as a kernel launched with
    `grid = n // BLOCK` and no tail mask does: the last n % 128 columns are left at zero. Right on the
    declared power-of-two widths, silently wrong on every other width."""
    n = x.shape[-1] // BLOCK * BLOCK
    out = torch.zeros_like(x)
    if n:
        head = x[..., :n]
        z = torch.exp(head - head.amax(dim=-1, keepdim=True))
        out[..., :n] = z / z.sum(dim=-1, keepdim=True)
    return out


def softmax_squeeze_rows(x):
    """Collapses the leading dimensions with `squeeze()` (meaning `reshape(-1, n)`): on a tensor with a
    size-1 dimension the softmax runs over the wrong axis, with no error."""
    rows = x.squeeze()
    z = torch.exp(rows - rows.amax(dim=-1, keepdim=True))
    return (z / z.sum(dim=-1, keepdim=True)).reshape(x.shape)
