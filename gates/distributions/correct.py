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
    """atan2 by octants, the signs read from the sign bits (so -0.0 counts as negative)."""
    base = torch.atan(y / x)
    negative_y = torch.signbit(y)
    turn = torch.where(negative_y, -torch.pi, torch.pi)
    out = torch.where(torch.signbit(x), base + turn, base)
    on_axis = torch.where(torch.signbit(x), turn, torch.where(negative_y, -0.0, 0.0))
    vertical = torch.where(negative_y, -torch.pi / 2, torch.pi / 2)
    out = torch.where(y == 0, on_axis.to(out.dtype), out)
    return torch.where((x == 0) & (y != 0), vertical.to(out.dtype), out)
