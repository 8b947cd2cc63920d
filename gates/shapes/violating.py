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


SCAN_BLOCK = 1024
SAMPLED_PAST = 8192
SLAB = 8192


def logcumsumexp_blocked_max_join(x):
    """A log-cumsum-exp along the last dimension scanned in blocks of 1024, the carry joined by
    max(a, b) + log1p(exp(-|a - b|)): |a - b| is NaN where both are -inf (a masked prefix) or both +inf, so
    the join gives NaN where torch.logaddexp gives -inf (+inf). Exact on rows of one block (<= 1024)."""
    out, carry = [], None
    for j in range(0, x.shape[-1], SCAN_BLOCK):
        part = torch.logcumsumexp(x[..., j:j + SCAN_BLOCK], dim=-1)
        if carry is not None:
            c = carry.unsqueeze(-1)
            part = torch.maximum(part, c) + torch.log1p(torch.exp(-(part - c).abs()))
        out.append(part)
        carry = part[..., -1]
    return torch.cat(out, dim=-1) if out else torch.empty_like(x)


def fake_quant_sampled_absmax(x):
    """Int8 fake quantisation per row whose absmax, on rows longer than 8192, is taken from a strided quarter
    of the row (x[..., ::4]): a row whose maximum is off the sample is clipped to the sample's maximum."""
    sample = x[..., ::4] if x.shape[-1] > SAMPLED_PAST else x
    scale = sample.abs().amax(dim=-1, keepdim=True) / 127
    return torch.round(x / scale).clamp(-127, 127) * scale


def matmul_split_k_drops_full_tail(a, b):
    """a @ b over K split into slabs of 8192 when K > 8192: a main loop over the slabs before the last, and an
    epilogue for the last slab that runs only when K % 8192 != 0 (meant for a ragged tail), so a K that is a
    multiple of 8192 (16384, 24576...) loses its last full slab. One slab (K <= 8192) is exact."""
    k = a.shape[-1]
    if k <= SLAB:
        return a @ b
    full = (k - 1) // SLAB
    out = a[:, :SLAB] @ b[:SLAB]
    for s in range(1, full):
        out = out + a[:, s * SLAB:(s + 1) * SLAB] @ b[s * SLAB:(s + 1) * SLAB]
    if k % SLAB:
        out = out + a[:, full * SLAB:] @ b[full * SLAB:]
    return out
