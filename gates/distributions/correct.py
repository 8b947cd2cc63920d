"""distributions, correct control: SiLU and softplus written with care for every magnitude.

Also holds the references and the inputs factory that the distributions controls share."""

import torch
import torch.nn.functional as F


def make_inputs(seed, shape=None, dtype=torch.float32, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape or (8, 256), generator=gen, dtype=torch.float64) * 2
    return (x.to(dtype=dtype, device=device),)


def silu_reference(x):
    return F.silu(x)


def softplus_reference(x):
    return F.softplus(x)


def silu(x):
    """x * sigmoid(x): subnormals stay subnormal, huge magnitudes saturate correctly."""
    return x * torch.sigmoid(x)


def softplus(x):
    """log(1 + exp(x)) without overflow: x + log1p(exp(-|x|)) for positive x, log1p(exp(x)) otherwise."""
    return torch.clamp_min(x, 0) + torch.log1p(torch.exp(-x.abs()))


def variance_reference(x):
    return torch.var(x, dim=-1, correction=0)


def logsumexp_reference(x):
    return torch.logsumexp(x, dim=-1)


def variance_two_pass(x):
    """The mean first, then the mean of squared deviations from it (in float32 inside, as a kernel's
    registers hold it): no cancellation whatever the offset."""
    xf = x.float()
    mean = xf.mean(dim=-1, keepdim=True)
    return ((xf - mean) ** 2).mean(dim=-1).to(x.dtype)


def variance_welford(x, block=64):
    """Welford's running mean and M2 in float32, block by block (Chan's combination of block statistics)."""
    xf = x.float()
    count = torch.zeros(x.shape[:-1], dtype=torch.float32, device=x.device)
    mean = torch.zeros_like(count)
    m2 = torch.zeros_like(count)
    for k0 in range(0, x.shape[-1], block):
        chunk = xf[..., k0:k0 + block]
        n_b = chunk.shape[-1]
        mean_b = chunk.mean(dim=-1)
        m2_b = ((chunk - mean_b.unsqueeze(-1)) ** 2).sum(dim=-1)
        total = count + n_b
        delta = mean_b - mean
        mean = mean + delta * (n_b / total)
        m2 = m2 + m2_b + delta * delta * (count * n_b / total)
        count = total
    return (m2 / count).to(x.dtype)


def logsumexp_online(x, block=64):
    """Blocked online logsumexp in float32: a running maximum that starts at -inf, the running sum rescaled
    whenever the maximum grows."""
    xf = x.float()
    m = torch.full(x.shape[:-1], -torch.inf, dtype=torch.float32, device=x.device)
    s = torch.zeros_like(m)
    for k0 in range(0, x.shape[-1], block):
        chunk = xf[..., k0:k0 + block]
        m_new = torch.maximum(m, chunk.amax(dim=-1))
        # an infinite maximum (an Inf in the row, or a row of -Inf so far) must not meet itself: inf - inf
        alpha = torch.where(m == m_new, torch.ones_like(m), torch.exp(m - m_new))
        shift = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        s = s * alpha + torch.exp(chunk - shift.unsqueeze(-1)).sum(dim=-1)
        m = m_new
    return (m + torch.log(s)).to(x.dtype)


def make_segments(seed, shape=None, dtype=torch.float32, device="cpu"):
    """16 rows of values and a distinct segment (of 32) for each: no index repeats in the factory's draws."""
    gen = torch.Generator().manual_seed(seed)
    values = torch.randn(16, 4, generator=gen, dtype=torch.float64).to(dtype=dtype, device=device)
    return values, torch.randperm(32, generator=gen)[:16].to(device)


def segment_sum_reference(values, index):
    return torch.zeros(32, values.shape[1], dtype=values.dtype, device=values.device).index_add_(0, index, values)


def segment_sum(values, index):
    """index_add_: rows that share a segment are summed."""
    out = torch.zeros(32, values.shape[1], dtype=values.dtype, device=values.device)
    return out.index_add_(0, index, values)


def make_rows(seed, shape=None, dtype=torch.float32, device="cpu"):
    """Long rows for the row sums: near the dtype's largest value a row's partial sums pass it."""
    return make_inputs(seed, shape or (64, 4096), dtype, device)


def row_sum_reference(x):
    """The exact row sum rounded to the dtype: no partial sum of it overflows."""
    return x.double().sum(-1).to(x.dtype)


def row_sum_tree(x):
    """Row sums in float32 by a pairwise tree over the row (as a GPU block reduction, `tl.sum`, combines its
    lanes): correct, though near the dtype's largest value a partial sum of the tree may overflow where the
    exact total and torch's order stay finite, which no bound on the total can tell from a flaw."""
    acc = x.float()
    width = 1 << max(acc.shape[-1] - 1, 0).bit_length()
    acc = torch.nn.functional.pad(acc, (0, width - acc.shape[-1]))
    while acc.shape[-1] > 1:
        acc = acc[..., 0::2] + acc[..., 1::2]
    return acc[..., 0].to(x.dtype)


def make_masked(seed, shape=None, dtype=torch.float32, device="cpu"):
    """Rows of values and a boolean mask of a random, never empty, valid prefix per row."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 17, (6,), generator=g)
    values = torch.randn(6, 16, 4, generator=g).to(dtype=dtype, device=device)
    return values, (torch.arange(16).unsqueeze(0) < lengths.unsqueeze(1)).to(device)


def masked_mean_reference(x, mask):
    total = torch.where(mask.unsqueeze(-1), x, torch.zeros((), dtype=x.dtype, device=x.device)).sum(dim=1)
    return total / mask.sum(dim=1, keepdim=True).to(x.dtype)


def masked_mean(x, mask):
    """A masked mean by masked_fill and a sum in one pass (0/0 = NaN where nothing is selected, as the
    reference; a NaN in an unselected position stays out)."""
    count = mask.sum(dim=1, keepdim=True)
    return x.masked_fill(~mask.unsqueeze(-1), 0.0).sum(dim=1) / count.to(x.dtype)


def make_pairs(seed, shape=None, dtype=torch.float32, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(8, 64, generator=g).to(dtype=dtype, device=device) for _ in range(2))


def angle_reference(y, x):
    return torch.atan2(y, x)


def angle(y, x):
    """atan2 by octants, the signs read from the sign bits (so -0.0 counts as negative), both operands infinite
    at the diagonals (+-pi/4, +-3pi/4) where y / x is NaN."""
    base = torch.atan(y / x)
    negative_y = torch.signbit(y)
    turn = torch.where(negative_y, -torch.pi, torch.pi)
    out = torch.where(torch.signbit(x), base + turn, base)
    on_axis = torch.where(torch.signbit(x), turn, torch.where(negative_y, -0.0, 0.0))
    vertical = torch.where(negative_y, -torch.pi / 2, torch.pi / 2)
    out = torch.where(y == 0, on_axis.to(out.dtype), out)
    out = torch.where((x == 0) & (y != 0), vertical.to(out.dtype), out)
    return torch.where(torch.isinf(y) & torch.isinf(x), _diagonal(y, x).to(out.dtype), out)


def _diagonal(y, x):
    """atan2 where both operands are infinite: +-pi/4 with x = +inf, +-3pi/4 with x = -inf, the sign of y."""
    corner = torch.where(x > 0, torch.pi / 4, 3 * torch.pi / 4)
    return torch.where(y > 0, corner, -corner)


# --- integer magnitudes and sentinels, permuted copies, mask structures -------------------------------------

def make_ids(seed, shape=None, dtype=torch.float32, device="cpu"):
    """A hashed embedding's table (1000 buckets of 8; 1000 is no power of two, so 2^32 is no multiple of it) and
    (4, 16) int64 ids below 50000."""
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(1000, 8, generator=g).to(dtype=dtype, device=device)
    return table, torch.randint(0, 50000, (4, 16), generator=g).to(device)


def hashed_embedding_reference(table, ids):
    return F.embedding(torch.remainder(ids, table.shape[0]), table)


def hashed_embedding(table, ids):
    """The bucket by torch.remainder on the int64 ids (floored: a row for every id, negative ones too)."""
    bucket = torch.remainder(ids, table.shape[0])
    return table.index_select(0, bucket.reshape(-1)).reshape(*ids.shape, table.shape[1])


def make_rotary(seed, shape=None, dtype=torch.float32, device="cpu"):
    """Queries (2 sequences of 16 positions, 2 heads of 32) and their int64 positions, consecutive from a random
    start below 1024 (exact in float16)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 16, 2, 32, generator=g).to(dtype=dtype, device=device)
    return x, (torch.randint(0, 1024, (2, 1), generator=g) + torch.arange(16)).to(device)


def rotary_reference(x, positions):
    d = x.shape[-1]
    inv_freq = 10000.0 ** (-torch.arange(0, d, 2, dtype=x.dtype, device=x.device) / d)
    angle = (positions.to(x.dtype).unsqueeze(-1) * inv_freq).unsqueeze(-2)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([x1 * angle.cos() - x2 * angle.sin(), x1 * angle.sin() + x2 * angle.cos()], dim=-1)


def rotary(x, positions):
    """Rotary embedding as a rotation of (x1, x2) pairs; the int64 positions converted to x's dtype as the
    reference converts them (float32 rounds them past 2^24, and the reference with it)."""
    d = x.shape[-1]
    inv_freq = 10000.0 ** (-torch.arange(0, d, 2, dtype=x.dtype, device=x.device) / d)
    angle = positions.to(x.dtype)[..., None, None] * inv_freq
    cos, sin = angle.cos(), angle.sin()
    x1, x2 = x.unflatten(-1, (2, d // 2)).unbind(-2)
    return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-2).flatten(-2)


def make_logits(seed, shape=None, dtype=torch.float32, device="cpu"):
    """Logits (64 rows of 10 classes) and int64 targets, none of them ignored (-100)."""
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(64, 10, generator=g) * 2).to(dtype=dtype, device=device)
    return logits, torch.randint(0, 10, (64,), generator=g).to(device)


def smoothed_cross_entropy_reference(logits, targets):
    return F.cross_entropy(logits, targets, ignore_index=-100, label_smoothing=0.1)


def smoothed_cross_entropy(logits, targets, smoothing=0.1):
    """Label-smoothed cross-entropy, mean over the rows whose target is not -100: those rows are out of both
    terms and of the count (0/0 = NaN where every row is ignored, as the reference)."""
    logp = torch.log_softmax(logits, dim=-1)
    valid = targets != -100
    nll = -logp.gather(-1, torch.where(valid, targets, 0).unsqueeze(-1)).squeeze(-1)
    per_row = (1 - smoothing) * nll - smoothing * logp.mean(dim=-1)
    return torch.where(valid, per_row, 0.0).sum() / valid.sum()


def make_channels(seed, shape=None, dtype=torch.float32, device="cpu"):
    """A batch of 4 images of 3 channels x 64 pixels, flattened: (4, 3, 64)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(4, 3, 64, generator=g).to(dtype=dtype, device=device),)


def gram_reference(x):
    return x @ x.transpose(1, 2)


def gram(x):
    """The channels' Gram matrix of every batch entry."""
    return torch.bmm(x, x.transpose(1, 2))


def make_attention(seed, shape=None, dtype=torch.float32, device="cpu"):
    """Attention scores (8 sequences, 4 queries, 16 keys) and a key mask (8, 16): a valid prefix of 1 to 15 keys
    per sequence (every sequence right-padded)."""
    g = torch.Generator().manual_seed(seed)
    scores = (torch.randn(8, 4, 16, generator=g) * 2).to(dtype=dtype, device=device)
    lengths = torch.randint(1, 16, (8, 1), generator=g)
    return scores, (torch.arange(16) < lengths).to(device)


def masked_softmax_reference(scores, mask):
    return scores.masked_fill(~mask.unsqueeze(1), float("-inf")).softmax(dim=-1)


def masked_softmax(scores, mask):
    """-inf at every masked key, always, then a softmax from the row's maximum (NaN where no key is valid, as the
    reference)."""
    z = scores.masked_fill(~mask.unsqueeze(1), float("-inf"))
    e = torch.exp(z - z.amax(dim=-1, keepdim=True))
    return e / e.sum(dim=-1, keepdim=True)


def make_activations(seed, shape=None, dtype=torch.float32, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape or (8, 64), generator=gen, dtype=torch.float64).to(dtype=dtype, device=device),)


def fake_quant_reference(x):
    """Per-row symmetric int8 quantise-dequantise: scale = absmax / 127, torch.round (half to even)."""
    scale = x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-8) / 127
    return torch.round(x / scale).clamp(-127, 127) * scale


def fake_quant_codes(x):
    """The same through int8 codes, the quotient as a product by the reciprocal scale (exact where the scale
    is a power of two, as on the ties)."""
    scale = x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-8) / 127
    codes = torch.round(x * (1 / scale)).clamp(-127, 127).to(torch.int8)
    return codes.to(x.dtype) * scale


def hashed_embedding_floor_divide(table, ids):
    """The bucket as id - (id // n) * n in int64 (floor division: a row for every id, negative ones too, at every
    magnitude int64 holds)."""
    n = table.shape[0]
    bucket = ids - torch.div(ids, n, rounding_mode="floor") * n
    return table.index_select(0, bucket.reshape(-1)).reshape(*ids.shape, table.shape[1])


# --- sorted boundaries, fractional weights ------------------------------------------------------------------

def make_ragged(seed, shape=None, dtype=torch.float32, device="cpu"):
    """A ragged batch: 32 segments of 4 to 12 rows each (evenly spread), their rows of 8 values one after another,
    and the int64 boundaries cu_seqlens (33,): 0, the running ends of the segments, the total row count."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(4, 13, (32,), generator=g)
    values = torch.randn(int(lengths.sum()), 8, generator=g).to(dtype=dtype, device=device)
    return values, torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]).to(device)


def segment_sums_reference(values, cu_seqlens):
    """Per segment [cu_seqlens[i], cu_seqlens[i + 1]), the sum of its rows (0 for an empty one). The boundaries
    must be sorted, from 0 to the row count."""
    if cu_seqlens.dim() != 1 or int(cu_seqlens[0]) != 0 or int(cu_seqlens[-1]) != values.shape[0] \
            or bool((cu_seqlens.diff() < 0).any()):
        raise ValueError("cu_seqlens must rise from 0 to the number of rows")
    segments = cu_seqlens.numel() - 1
    ids = torch.repeat_interleave(torch.arange(segments, device=values.device), cu_seqlens.diff())
    out = torch.zeros(segments, values.shape[1], dtype=values.dtype, device=values.device)
    return out.index_add_(0, ids, values)


def segment_sums_search(values, cu_seqlens):
    """Every row's segment by a binary search of the boundaries (the last boundary at or before it: empty
    segments skipped), then one index_add_."""
    rows = torch.arange(values.shape[0], device=values.device)
    ids = torch.searchsorted(cu_seqlens, rows, right=True) - 1
    out = torch.zeros(cu_seqlens.numel() - 1, values.shape[1], dtype=values.dtype, device=values.device)
    return out.index_add_(0, ids, values)


def segment_sums_marker_scan(values, cu_seqlens):
    """Every row's segment as a running count of the boundaries at or before it: a marker added at each interior
    boundary (a repeated boundary adds twice), then a cumulative sum and one index_add_."""
    marker = torch.zeros(values.shape[0] + 1, dtype=torch.long, device=values.device)
    interior = cu_seqlens[1:-1]
    marker.index_add_(0, interior, torch.ones_like(interior))
    out = torch.zeros(cu_seqlens.numel() - 1, values.shape[1], dtype=values.dtype, device=values.device)
    return out.index_add_(0, marker.cumsum(0)[:-1], values)


def make_weighted(seed, shape=None, dtype=torch.float32, device="cpu"):
    """Rows of values (8, 32, 16) and float weights (8, 32) of 0 and 1 (a mask as floats; every row keeps its
    first position)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(8, 32, 16, generator=g)
    w = (torch.rand(8, 32, generator=g) < 0.6).float()
    w[:, 0] = 1.0
    return x.to(dtype=dtype, device=device), w.to(dtype=dtype, device=device)


def weighted_mean_reference(x, w):
    """The mean over the sequence (dimension 1) weighted by `w`, which must lie in [0, 1] (soft weights): the
    weights normalized to sum to 1 per row, then the sum of x times them."""
    if not bool(((w >= 0) & (w <= 1)).all()):
        raise ValueError("the weights must lie in [0, 1]")
    return (x * (w / w.sum(dim=1, keepdim=True)).unsqueeze(-1)).sum(dim=1)


def weighted_mean_bmm(x, w):
    """The weights normalized per row, then applied as one batched product (1 x L) @ (L x D) per row."""
    return torch.bmm((w / w.sum(dim=1, keepdim=True)).unsqueeze(1), x).squeeze(1)


def make_tokens(seed, shape=None, dtype=torch.float32, device="cpu"):
    """Token ids drawn from a vocabulary of 64 (a batch of sequences)."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.randint(0, 64, shape or (2, 12), generator=gen).to(device),)


class TokenTable(torch.nn.Module):
    """An embedding table: a gather of its rows (a fresh tensor); the reference."""

    def __init__(self):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(64, 8, generator=torch.Generator().manual_seed(5)))

    def forward(self, ids):
        return torch.nn.functional.embedding(ids, self.table)


class TokenTableRunCopy(TokenTable):
    """A fast path for a contiguous run of ids (one slab of the table), copied out of the table."""

    def forward(self, ids):
        flat = ids.reshape(-1)
        p = int(flat[0]) if flat.numel() else 0
        if flat.numel() and torch.equal(flat, torch.arange(p, p + flat.numel(), device=flat.device)):
            return self.table[p:p + flat.numel()].clone().view(*ids.shape, -1)
        return torch.nn.functional.embedding(ids, self.table)


token_table = TokenTable()
token_table_run_copy = TokenTableRunCopy()
