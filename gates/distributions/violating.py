"""distributions, violating controls: right on normal-looking inputs, wrong at the extremes."""

from pathlib import Path

import torch

from kgate.loading import load_module_from_file


def silu_flush_subnormals(x):
    """SiLU as a kernel compiled with fast-math computes it: subnormal inputs and results are flushed
    to zero (FTZ/DAZ), so tiny activations vanish where the reference keeps them."""
    tiny = torch.finfo(x.dtype).tiny
    x = torch.where(x.abs() < tiny, torch.zeros_like(x), x)
    out = x * torch.sigmoid(x)
    return torch.where(out.abs() < tiny, torch.zeros_like(out), out)


def softplus_clamped(x):
    """Softplus that clamps its input "to avoid overflow in exp": exact for ordinary inputs, but every
    input above 80 comes out as 80, where the truth is the input itself."""
    return torch.log1p(torch.exp(x.clamp(max=80.0)))


def variance_one_pass(x):
    """Variance in one pass as E[x^2] - E[x]^2 in float32 (one read of the row, two running sums): exact
    enough on zero-mean inputs, but it cancels catastrophically once the values share an offset that is
    large against their spread."""
    xf = x.float()
    mean = xf.mean(dim=-1)
    return ((xf * xf).mean(dim=-1) - mean * mean).to(x.dtype)


def logsumexp_max_from_zero(x, block=64):
    """Blocked online logsumexp in float32 whose running maximum starts at 0 instead of -inf: right while
    some value of the row is above about -80, but on a row that lies entirely far below zero every
    exp(x - 0) underflows, the sum is 0 and the result log(0) = -inf."""
    xf = x.float()
    m = torch.zeros(x.shape[:-1], dtype=torch.float32, device=x.device)
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


def segment_sum_stored(values, index):
    """Segment sums as one scatter store: right while no index repeats (the factory draws distinct ones),
    wrong where two rows share a segment: one of them is kept instead of their sum."""
    out = torch.zeros(32, values.shape[1], dtype=values.dtype, device=values.device)
    out[index] = values
    return out


def row_sum_prescaled(x):
    """correct.py:row_sum_tree on inputs scaled up by a fixed 2^110 (to keep tiny values out of the subnormal
    range) and scaled back after: its partial sums overflow at magnitudes of 1e6, where every order of the
    exact terms stays far inside float32's range."""
    acc = x.float() * 2.0**110
    width = 1 << max(acc.shape[-1] - 1, 0).bit_length()
    acc = torch.nn.functional.pad(acc, (0, width - acc.shape[-1]))
    while acc.shape[-1] > 1:
        acc = acc[..., 0::2] + acc[..., 1::2]
    return (acc[..., 0] * 2.0**-110).to(x.dtype)


def masked_mean_clamped(x, mask):
    """A masked mean whose count is clamped at 1 "so the division needs no special case": 0 where nothing is
    selected, where the reference gives 0/0 = NaN. Random masks always select something."""
    total = torch.where(mask.unsqueeze(-1), x, torch.zeros((), dtype=x.dtype, device=x.device)).sum(dim=1)
    return total / mask.sum(dim=1, keepdim=True).clamp(min=1).to(x.dtype)


def angle_by_comparisons(y, x):
    """atan2 by octants with the signs tested by `< 0`: -0.0 is taken as +0.0, so atan2(-0.0, x < 0) gives pi
    where it is -pi (both operands infinite handled as the correct control does: its flaw is the zeros' sign
    alone)."""
    base = torch.atan(y / x)
    turn = torch.where(y < 0, -torch.pi, torch.pi)
    out = torch.where(x < 0, base + turn, base)
    vertical = torch.where(y < 0, -torch.pi / 2, torch.where(y > 0, torch.pi / 2, 0.0))
    out = torch.where(x == 0, vertical.to(out.dtype), out)
    corner = torch.where(x > 0, torch.pi / 4, 3 * torch.pi / 4)
    return torch.where(torch.isinf(y) & torch.isinf(x), torch.where(y > 0, corner, -corner).to(out.dtype), out)


def hashed_embedding_float_bucket(table, ids):
    """A hashed embedding's bucket as id - floor(id / n) * n in float32: exact for ids below 2^24, the wrong row
    for odd ids past it, which float32 rounds (the integer family 'past float32's integers')."""
    n, f = table.shape[0], ids.float()
    bucket = (f - torch.floor(f / n) * n).long()
    return table.index_select(0, bucket.reshape(-1)).reshape(*ids.shape, table.shape[1])


def hashed_embedding_int32(table, ids):
    """The ids narrowed to int32 before the remainder: they wrap past 2^31 (the integer family 'past int32')."""
    bucket = torch.remainder(ids.to(torch.int32), table.shape[0]).long()
    return table.index_select(0, bucket.reshape(-1)).reshape(*ids.shape, table.shape[1])


def hashed_embedding_fmod(table, ids):
    """The bucket by torch.fmod (truncated: negative for a negative id), fed to index_select, which raises where
    the reference's floored remainder gives a row (the integer family 'negated')."""
    bucket = torch.fmod(ids, table.shape[0])
    return table.index_select(0, bucket.reshape(-1)).reshape(*ids.shape, table.shape[1])


def rotary_float16_positions(x, positions):
    """Rotary embedding whose positions go through float16 before they meet inv_freq: exact up to 2048, every odd
    position rounded past it (the integer family 'past float16's integers')."""
    d = x.shape[-1]
    inv_freq = 10000.0 ** (-torch.arange(0, d, 2, dtype=x.dtype, device=x.device) / d)
    angle = (positions.to(torch.float16).to(x.dtype).unsqueeze(-1) * inv_freq).unsqueeze(-2)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([x1 * angle.cos() - x2 * angle.sin(), x1 * angle.sin() + x2 * angle.cos()], dim=-1)


def smoothed_cross_entropy_unmasked(logits, targets, smoothing=0.1):
    """Label-smoothed cross-entropy whose smoothing term is summed over every row, ignored ones (target -100)
    too: right while no target is ignored (the integer family 'sentinel -100')."""
    logp = torch.log_softmax(logits, dim=-1)
    valid = targets != -100
    nll = -logp.gather(-1, torch.where(valid, targets, 0).unsqueeze(-1)).squeeze(-1)
    return ((1 - smoothing) * torch.where(valid, nll, 0.0).sum() - smoothing * logp.mean(dim=-1).sum()) / valid.sum()


class SmoothedCrossEntropyCachedCount:
    """Label-smoothed cross-entropy, masked right, whose divisor (the number of targets not -100) is counted on the
    first call at each shape and kept: right on the factory's inputs, wrong once other targets are ignored at the
    same shape (the integer family 'sentinel -100', judged after the factory's inputs on the same instance)."""

    def __init__(self):
        self.counts = {}

    def __call__(self, logits, targets, smoothing=0.1):
        logp = torch.log_softmax(logits, dim=-1)
        valid = targets != -100
        count = self.counts.setdefault(tuple(targets.shape), valid.sum())
        nll = -logp.gather(-1, torch.where(valid, targets, 0).unsqueeze(-1)).squeeze(-1)
        per_row = (1 - smoothing) * nll - smoothing * logp.mean(dim=-1)
        return torch.where(valid, per_row, 0.0).sum() / count


smoothed_cross_entropy_cached_count = SmoothedCrossEntropyCachedCount()


def gram_dedup_by_checksum(x):
    """Batched Gram matrices x @ x^T, one per distinct (sum, sum of squares) of a batch entry (of its values sorted:
    the same for any order of the same values), shared among the entries whose checksums are equal: a permuted
    copy (a channel-permuted image) gets the original's (the floating family 'permuted copies')."""
    out = torch.empty(x.shape[0], x.shape[1], x.shape[1], dtype=x.dtype, device=x.device)
    grams = {}
    for b in range(x.shape[0]):
        values = x[b].double().reshape(-1).sort().values
        key = (float(values.sum()), float((values * values).sum()))
        if key not in grams:
            grams[key] = x[b] @ x[b].T
        out[b] = grams[key]
    return out


def masked_softmax_assumes_right_padding(scores, mask):
    """Masked softmax that skips the mask when every row's last key is valid, taking that for "nothing padded"
    (right padding assumed): wrong on left-padded masks and masks with holes (the boolean family 'left padding')."""
    if bool(mask[:, -1].all()):
        return torch.softmax(scores, dim=-1)
    z = scores.masked_fill(~mask.unsqueeze(1), float("-inf"))
    e = torch.exp(z - z.amax(dim=-1, keepdim=True))
    return e / e.sum(dim=-1, keepdim=True)


def fake_quant_round_half_away(x):
    """Per-row int8 fake quantisation that rounds as C's roundf, copysign(floor(|v| + 0.5), v): halves away from
    zero where torch.round goes to even, one step off on every exact tie (values on the int8 grid's midpoints)."""
    scale = x.abs().amax(dim=-1, keepdim=True).clamp(min=1e-8) / 127
    v = x / scale
    return torch.copysign(torch.floor(v.abs() + 0.5), v).clamp(-127, 127) * scale


def hashed_embedding_float64_bucket(table, ids):
    """The bucket as id - floor(id / n) * n in float64 (a float division, cheaper than int64's on a GPU): exact for
    ids below 2^53, the wrong row for odd ids past it, which float64 rounds (the integer family 'past float64's
    integers')."""
    n, f = table.shape[0], ids.double()
    bucket = (f - torch.floor(f / n) * n).long()
    return table.index_select(0, bucket.reshape(-1)).reshape(*ids.shape, table.shape[1])


def segment_sums_marker_store(values, cu_seqlens):
    """Every row's segment as a running count of the markers at or before it, the markers set by a scatter store
    at each interior boundary: a boundary repeated (an empty segment in the middle) marks once, so every later row
    lands one segment early (the sorted family 'repeated boundaries')."""
    marker = torch.zeros(values.shape[0] + 1, dtype=torch.long, device=values.device)
    marker[cu_seqlens[1:-1]] = 1
    out = torch.zeros(cu_seqlens.numel() - 1, values.shape[1], dtype=values.dtype, device=values.device)
    return out.index_add_(0, marker.cumsum(0)[:-1], values)


def segment_sums_padded(values, cu_seqlens, multiple=8):
    """Segments gathered into a padded (segments, width, features) slab and summed along the width, the width a
    static `multiple` of the mean segment length (from the shapes: no host sync for the longest): rows past the
    width in a longer segment are dropped (the sorted families 'one long segment last' and 'first')."""
    segments = cu_seqlens.numel() - 1
    width = multiple * -(-values.shape[0] // segments)
    position = cu_seqlens[:-1].unsqueeze(1) + torch.arange(width, device=values.device)
    inside = position < cu_seqlens[1:].unsqueeze(1)
    rows = values[position.clamp(max=values.shape[0] - 1)]
    return torch.where(inside.unsqueeze(-1), rows, torch.zeros((), dtype=values.dtype)).sum(dim=1)


def weighted_mean_binarized(x, w):
    """A weighted mean whose weights are taken for a 0/1 mask: kept positions by w.bool(), counted as integers
    (exact on any length) and multiplied in as 0/1: right on 0/1 weights (and any common scale of them), wrong on
    fractional ones (the weight families 'fractional weights' and 'uniform weights')."""
    keep = w.bool()
    num = (x * keep.to(x.dtype).unsqueeze(-1)).sum(dim=1)
    return num / keep.sum(dim=1, keepdim=True).to(x.dtype)


def _correct():
    """This folder's correct.py, loaded by path (a plain import would find another folder's)."""
    return load_module_from_file(Path(__file__).resolve().parent / "correct.py", "catalogue")


class TokenTableRunView(_correct().TokenTable):
    """A fast path for a contiguous run of ids, returned as a slice of the table (a view of the parameter):
    random ids never take it; a run of consecutive ids gets an output that an optimizer step then changes."""

    def forward(self, ids):
        flat = ids.reshape(-1)
        p = int(flat[0]) if flat.numel() else 0
        if flat.numel() and torch.equal(flat, torch.arange(p, p + flat.numel(), device=flat.device)):
            return self.table[p:p + flat.numel()].view(*ids.shape, -1)
        return torch.nn.functional.embedding(ids, self.table)


token_table_run_view = TokenTableRunView()
