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


# -- sizes the factory ties together, rows past a CUDA grid's y limit, empty reductions, plans per shape -----

KEY_BLOCK = 16


def make_attention_inputs(seed, shape=None, dtype=torch.float32, device="cpu"):
    """q, k, v of (batch, heads, 48, 16) for `shape` (batch, heads): one length and one width for all three, as a
    self-attention factory draws them."""
    (b, h), n, d = shape or (2, 2), 48, 16
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, h, n, d, generator=gen, dtype=torch.float64).to(dtype=dtype, device=device)
                 for _ in range(3))


def attention_reference(q, k, v):
    return torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, dim=-1) @ v


def attention_online(q, k, v):
    """Attention with an online softmax over blocks of KEY_BLOCK keys, as many blocks as the keys need; the
    output as wide as the values."""
    scores_scale = max(q.shape[-1], 1) ** -0.5
    top = q.new_full(q.shape[:-1] + (1,), float("-inf"))
    total = q.new_zeros(q.shape[:-1] + (1,))
    acc = q.new_zeros(q.shape[:-1] + (v.shape[-1],))
    for s in range(0, k.shape[-2], KEY_BLOCK):
        scores = q @ k[..., s:s + KEY_BLOCK, :].transpose(-2, -1) * scores_scale
        new_top = torch.maximum(top, scores.amax(dim=-1, keepdim=True))
        p, rescale = torch.exp(scores - new_top), torch.exp(top - new_top)
        total = total * rescale + p.sum(dim=-1, keepdim=True)
        acc = acc * rescale + p @ v[..., s:s + KEY_BLOCK, :]
        top = new_top
    if k.shape[-2] == 0:  # no keys: the reference's empty weighted sum
        return acc
    return acc / total


def make_rows(seed, shape=None, dtype=torch.float32, device="cpu"):
    """One (rows, features) tensor; `shape` is swept by the shapes gate."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape or (256, 8), generator=gen, dtype=torch.float64).to(dtype=dtype, device=device),)


def row_norm_reference(x):
    return torch.nn.functional.layer_norm(x, x.shape[-1:])


def row_norm(x):
    """(x - mean) / sqrt(var + eps) per row, every row, however many."""
    mean = x.mean(dim=-1, keepdim=True)
    var = (x - mean).pow(2).mean(dim=-1, keepdim=True)
    return (x - mean) * torch.rsqrt(var + 1e-5)


def logsumexp_reference(x):
    return torch.logsumexp(x, dim=-1)


def logsumexp_rows(x):
    """A max-shifted log-sum-exp per row; an empty row's sum is empty: log 0 = -inf."""
    if x.shape[-1] == 0:
        return x.new_full(x.shape[:-1], float("-inf"))
    top = x.amax(dim=-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    return (x - top).exp().sum(dim=-1).log() + top.squeeze(-1)


def row_sum_reference(x):
    return x.sum(dim=-1)


_ROW_MAPS: dict = {}


def row_sums_planned(x):
    """Row sums through one index_add_ over the flattened tensor, the row of each element planned once per
    shape and device."""
    key = (tuple(x.shape), x.device)
    if key not in _ROW_MAPS:
        _ROW_MAPS[key] = torch.arange(x.numel(), device=x.device) // max(x.shape[-1], 1)
    out = x.new_zeros(x.shape[:-1].numel(), dtype=torch.float64)  # a float64 total, as long rows need
    out.index_add_(0, _ROW_MAPS[key], x.reshape(-1).double())
    return out.reshape(x.shape[:-1]).to(x.dtype)


PARALLEL_MIN = 1 << 20  # the chunked path: from this many elements
CHUNKS = 6


def leaky_relu_reference(x):
    return torch.nn.functional.leaky_relu(x, 0.1)


def leaky_relu_chunked(x):
    """Leaky ReLU; from 2^20 elements the flat tensor in 6 chunks (one per worker), the last taking what is left."""
    if x.numel() < PARALLEL_MIN:
        return torch.nn.functional.leaky_relu(x, 0.1)
    flat, out = x.reshape(-1), torch.empty_like(x).reshape(-1)
    step = flat.numel() // CHUNKS
    for i in range(CHUNKS):
        part = slice(i * step, (i + 1) * step if i < CHUNKS - 1 else flat.numel())
        out[part] = torch.nn.functional.leaky_relu(flat[part], 0.1)
    return out.view(x.shape)


WORKSPACE_ROWS = 4096  # the row-blocked path: from this many rows


def row_sums_reference(x):
    return x.sum(dim=-1)


def row_sums_blocked(x):
    """Row sums; from 4096 rows in blocks of 1024 rows written into a fresh output."""
    if x.shape[0] < WORKSPACE_ROWS:
        return x.sum(dim=-1)
    out = torch.empty(x.shape[0], dtype=x.dtype, device=x.device)
    for start in range(0, x.shape[0], 1024):
        out[start:start + 1024] = x[start:start + 1024].sum(dim=-1)
    return out
