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


def attention_key_blocks_from_queries(q, k, v):
    """Attention over blocks of 16 keys whose count is taken from the queries' length (a self-attention kernel's
    grid): right wherever there are as many keys as queries; the keys past the queries' blocks are silently
    left out otherwise."""
    visited = -(-q.shape[-2] // 16) * 16
    k, v = k[..., :visited, :], v[..., :visited, :]
    return torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, dim=-1) @ v


GRID_Y = 65535  # the most blocks a CUDA grid's y dimension takes


def row_norm_grid_rows(x):
    """(x - mean) / sqrt(var + eps) per row, one program per row on a grid whose row count is clamped to the
    65535 blocks a CUDA grid's y dimension takes (the launch would fail past it): rows past 65535 stay as the
    zeroed output left them."""
    out = torch.zeros_like(x)
    rows = x[:GRID_Y]
    mean = rows.mean(dim=-1, keepdim=True)
    var = (rows - mean).pow(2).mean(dim=-1, keepdim=True)
    out[:GRID_Y] = (rows - mean) * torch.rsqrt(var + 1e-5)
    return out


def logsumexp_rows_empty_zero(x):
    """A max-shifted log-sum-exp per row that returns 0 for rows with nothing to sum (the empty sum's log is
    -inf)."""
    if x.shape[-1] == 0:
        return x.new_zeros(x.shape[:-1])
    top = x.amax(dim=-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    return (x - top).exp().sum(dim=-1).log() + top.squeeze(-1)


_ROW_MAPS: dict = {}


def row_sums_planned_by_count(x):
    """Row sums through one index_add_ over the flattened tensor, the row of each element planned once per
    element count: another split of the same count (twice the rows, half the columns) reuses the old plan and
    sums the wrong groups."""
    key = (x.numel(), x.device)
    if key not in _ROW_MAPS:
        _ROW_MAPS[key] = torch.arange(x.numel(), device=x.device) // max(x.shape[-1], 1)
    out = x.new_zeros(x.shape[:-1].numel(), dtype=torch.float64)  # a float64 total, as long rows need
    out.index_add_(0, _ROW_MAPS[key].clamp(max=max(out.numel() - 1, 0)), x.reshape(-1).double())
    return out.reshape(x.shape[:-1]).to(x.dtype)


PARALLEL_MIN = 1 << 20  # the chunked path: from this many elements
CHUNKS = 6


def leaky_relu_chunked_drops_tail(x):
    """Leaky ReLU; from 2^20 elements the flat tensor in 6 chunks of numel // 6: the last numel % 6 elements of the
    output are never written (left 0; an uninitialised tail would be the initialization gate's finding too, and could
    happen to hold the reference's freed result). The declared shapes never reach the chunked path."""
    if x.numel() < PARALLEL_MIN:
        return torch.nn.functional.leaky_relu(x, 0.1)
    flat, out = x.reshape(-1), torch.zeros_like(x).reshape(-1)
    step = flat.numel() // CHUNKS
    for i in range(CHUNKS):
        out[i * step:(i + 1) * step] = torch.nn.functional.leaky_relu(flat[i * step:(i + 1) * step], 0.1)
    return out.view(x.shape)


WORKSPACE_ROWS = 4096  # the row-blocked path: from this many rows
_workspace: dict = {}


def row_sums_workspace(x):
    """Row sums; from 4096 rows in blocks of 1024 rows written into a workspace kept between calls and returned
    as the output: the next call at that size overwrites the output an earlier call returned."""
    if x.shape[0] < WORKSPACE_ROWS:
        return x.sum(dim=-1)
    key = (x.shape[0], x.dtype, x.device)
    if key not in _workspace:
        _workspace[key] = torch.empty(x.shape[0], dtype=x.dtype, device=x.device)
    out = _workspace[key]
    for start in range(0, x.shape[0], 1024):
        out[start:start + 1024] = x[start:start + 1024].sum(dim=-1)
    return out
