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


# -- past a block threshold: scans across blocks, paths for long rows and long reductions ----------------

SCAN_BLOCK = 1024
SLAB = 8192


def logcumsumexp_reference(x):
    return torch.logcumsumexp(x, dim=-1)


def logcumsumexp_blocked(x):
    """A log-cumsum-exp along the last dimension scanned in blocks of 1024, each block's scan joined to the
    carry of the ones before with torch.logaddexp (-inf with -inf is -inf, +inf with +inf is +inf)."""
    out, carry = [], None
    for j in range(0, x.shape[-1], SCAN_BLOCK):
        part = torch.logcumsumexp(x[..., j:j + SCAN_BLOCK], dim=-1)
        if carry is not None:
            part = torch.logaddexp(part, carry.unsqueeze(-1))
        out.append(part)
        carry = part[..., -1]
    return torch.cat(out, dim=-1) if out else torch.empty_like(x)


def fake_quant_reference(x):
    """Symmetric int8 fake quantisation per row: scale = absmax / 127."""
    scale = x.abs().amax(dim=-1, keepdim=True) / 127
    return torch.round(x / scale).clamp(-127, 127) * scale


def fake_quant_rows(x):
    """The reference's computation, the absmax over every element of the row at every length."""
    scale = x.abs().amax(dim=-1, keepdim=True) / 127
    return torch.round(x / scale).clamp(-127, 127) * scale


def make_matmul_inputs(seed, shape=None, dtype=torch.float32, device="cpu"):
    """a (M, K) and b (K, N) for `shape` (M, K, N)."""
    m, k, n = shape or (16, 1024, 16)
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=gen, dtype=torch.float64)
    b = torch.randn(k, n, generator=gen, dtype=torch.float64)
    return a.to(dtype=dtype, device=device), b.to(dtype=dtype, device=device)


def matmul_reference(a, b):
    return a @ b


def matmul_split_k(a, b):
    """a @ b with the reduction over K split into slabs of 8192 summed one after another: every slab, the last
    one whether it is full or ragged."""
    out = a[:, :0] @ b[:0]
    for s in range(0, a.shape[-1], SLAB):
        out = out + a[:, s:s + SLAB] @ b[s:s + SLAB]
    return out
