"""References and input factories for FlagGems' ATen ops (examples/field/flaggems).

FlagGems implements ATen operators, so each reference is the torch op itself (its eager ATen
implementation, or torch.nn.functional where that is the public entry). Nothing here imports FlagGems:
the oracle runs these functions in float64 on upcast copies of the inputs.

Every factory is called as `make_*(seed, shape=, dtype=, device=)` and returns the argument tuple in
the order the kernel wrapper (kernels.py) and the reference take it. `shape` is interpreted per
family (the docstring says how); a factory raises ValueError on a shape outside the op's domain, which
kgate's shapes gate then skips. Integer tensors (indices) and boolean tensors (conditions) keep their
dtype; kgate casts the floating-point ones to the case's dtype.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

EPS_NORM = 1e-5  # layer_norm's and rms_norm's epsilon (torch.nn.LayerNorm's default)
CLAMP_MIN, CLAMP_MAX = -1.5, 2.0
ADDMM_BETA, ADDMM_ALPHA = 0.5, 2.0
INDEX_ADD_ALPHA = 0.5
NAN_TO_NUM = {"nan": 0.0, "posinf": 1e4, "neginf": -1e4}


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(gen, shape, dtype, device, scale=1.0, offset=0.0):
    x = torch.randn(tuple(shape), generator=gen, dtype=torch.float64) * scale + offset
    return x.to(dtype=dtype, device=device)


def _uniform(gen, shape, low, high, dtype, device):
    x = torch.rand(tuple(shape), generator=gen, dtype=torch.float64) * (high - low) + low
    return x.to(dtype=dtype, device=device)


def _rank(shape, rank: int, what: str):
    if shape is None or len(shape) != rank:
        raise ValueError(f"{what} takes a shape of {rank} sizes, got {shape}")
    return tuple(int(s) for s in shape)


# ------------------------------------------------------------------------------------------------
# Factories


def make_rows(seed, shape=(64, 1000), dtype=torch.float32, device="cpu"):
    """One activation tensor of any rank (the last dimension is the one reduced): logits-like values,
    randn * 3."""
    return (_randn(_gen(seed), shape, dtype, device, scale=3.0),)


def make_positive(seed, shape=(64, 1000), dtype=torch.float32, device="cpu"):
    """One tensor of positive values spread over four decades, 1e-2 .. 1e2 (log, rsqrt, pow's base)."""
    gen = _gen(seed)
    exponent = torch.rand(tuple(shape), generator=gen, dtype=torch.float64) * 4 - 2
    return ((10.0 ** exponent).to(dtype=dtype, device=device),)


def make_pair(seed, shape=(64, 1000), dtype=torch.float32, device="cpu"):
    """Two tensors of the same shape, randn (maximum, div's numerator and denominator)."""
    gen = _gen(seed)
    return _randn(gen, shape, dtype, device), _randn(gen, shape, dtype, device)


def make_pow(seed, shape=(64, 1000), dtype=torch.float32, device="cpu"):
    """pow(base, exponent): a positive base (1e-1 .. 1e1) and an exponent in [-3, 3]."""
    gen = _gen(seed)
    base = 10.0 ** (torch.rand(tuple(shape), generator=gen, dtype=torch.float64) * 2 - 1)
    exponent = torch.rand(tuple(shape), generator=gen, dtype=torch.float64) * 6 - 3
    return base.to(dtype=dtype, device=device), exponent.to(dtype=dtype, device=device)


def make_where(seed, shape=(64, 1000), dtype=torch.float32, device="cpu"):
    """where(condition, a, b): a boolean condition (about half true) and two randn tensors."""
    gen = _gen(seed)
    cond = (torch.rand(tuple(shape), generator=gen) < 0.5).to(device)
    return cond, _randn(gen, shape, dtype, device), _randn(gen, shape, dtype, device)


def make_with_nonfinite(seed, shape=(64, 1000), dtype=torch.float32, device="cpu"):
    """randn * 3 with about 1% NaN, 1% +Inf and 1% -Inf entries (isnan, isinf, nan_to_num see all three)."""
    gen = _gen(seed)
    x = torch.randn(tuple(shape), generator=gen, dtype=torch.float64) * 3
    u = torch.rand(tuple(shape), generator=gen, dtype=torch.float64)
    x = torch.where(u < 0.01, torch.nan, x)
    x = torch.where((u >= 0.01) & (u < 0.02), torch.inf, x)
    x = torch.where((u >= 0.02) & (u < 0.03), -torch.inf, x)
    return (x.to(dtype=dtype, device=device),)


def make_norm(seed, shape=(64, 1024), dtype=torch.float32, device="cpu"):
    """layer_norm(x, weight, bias) over the last dimension: activations randn with a per-row offset and
    scale, weight around 1, bias around 0 (as a trained LayerNorm's)."""
    if shape is None or len(shape) < 1 or shape[-1] < 1:
        raise ValueError(f"layer_norm needs a normalized dimension of size >= 1, got {shape}")
    gen = _gen(seed)
    n = shape[-1]
    rows = tuple(shape[:-1]) + (1,)
    x = torch.randn(tuple(shape), generator=gen, dtype=torch.float64)
    x = x * (0.5 + torch.rand(rows, generator=gen, dtype=torch.float64) * 2) + torch.randn(rows, generator=gen,
                                                                                         dtype=torch.float64)
    weight = 1 + 0.1 * torch.randn(n, generator=gen, dtype=torch.float64)
    bias = 0.1 * torch.randn(n, generator=gen, dtype=torch.float64)
    return tuple(t.to(dtype=dtype, device=device) for t in (x, weight, bias))


def make_rms_norm(seed, shape=(64, 1024), dtype=torch.float32, device="cpu"):
    """rms_norm(x, weight) over the last dimension: activations randn, weight around 1."""
    x, weight, _ = make_norm(seed, shape=shape, dtype=dtype, device=device)
    return x, weight


def make_mm(seed, shape=(256, 384, 320), dtype=torch.float32, device="cpu"):
    """mm(a, b) for shape (M, K, N): a (M, K) and b (K, N), randn scaled by 1/sqrt(K) like activations
    times weights."""
    m, k, n = _rank(shape, 3, "mm")
    gen = _gen(seed)
    return _randn(gen, (m, k), dtype, device), _randn(gen, (k, n), dtype, device, scale=1 / math.sqrt(max(k, 1)))


def make_addmm(seed, shape=(256, 384, 320), dtype=torch.float32, device="cpu"):
    """addmm(bias, a, b) for shape (M, K, N): a linear layer's bias (N,), input (M, K), weight (K, N)."""
    a, b = make_mm(seed, shape=shape, dtype=dtype, device=device)
    bias = _randn(_gen(seed + 1), (shape[2],), dtype, device, scale=0.1)
    return bias, a, b


def make_bmm(seed, shape=(8, 128, 96, 80), dtype=torch.float32, device="cpu"):
    """bmm(a, b) for shape (B, M, K, N): a (B, M, K), b (B, K, N)."""
    bsz, m, k, n = _rank(shape, 4, "bmm")
    gen = _gen(seed)
    return (_randn(gen, (bsz, m, k), dtype, device),
            _randn(gen, (bsz, k, n), dtype, device, scale=1 / math.sqrt(max(k, 1))))


def make_embedding(seed, shape=(4, 128, 32000, 256), dtype=torch.float32, device="cpu"):
    """embedding(indices, weight) for shape (B, T, V, D): token ids (B, T) in [0, V) with repeats (a
    sequence's tokens recur) and a weight table (V, D), randn."""
    bsz, t, v, d = _rank(shape, 4, "embedding")
    if v < 1:
        raise ValueError(f"embedding needs a vocabulary of size >= 1, got V={v}")
    gen = _gen(seed)
    pool = torch.randint(0, v, (max(1, (bsz * t) // 2),), generator=gen)
    ids = pool[torch.randint(0, pool.numel(), (bsz, t), generator=gen)]
    return ids.to(device), _randn(gen, (v, d), dtype, device)


def make_index_select(seed, shape=(512, 768, 300), dtype=torch.float32, device="cpu"):
    """index_select(x, 0, index) for shape (M, N, K): x (M, N) and K row indices in [0, M), with
    repeats."""
    m, n, k = _rank(shape, 3, "index_select")
    if m < 1 and k > 0:
        raise ValueError(f"index_select draws indices in [0, M), M={m}")
    gen = _gen(seed)
    index = torch.randint(0, max(m, 1), (k,), generator=gen)
    return _randn(gen, (m, n), dtype, device), index.to(device)


def make_gather(seed, shape=(128, 1000, 64), dtype=torch.float32, device="cpu"):
    """gather(x, 1, index) for shape (M, N, K): x (M, N) and index (M, K) in [0, N) (a top-k's
    positions, with repeats)."""
    m, n, k = _rank(shape, 3, "gather")
    if n < 1 and m * k > 0:
        raise ValueError(f"gather draws indices in [0, N), N={n}")
    gen = _gen(seed)
    index = torch.randint(0, max(n, 1), (m, k), generator=gen)
    return _randn(gen, (m, n), dtype, device), index.to(device)


def make_scatter(seed, shape=(128, 1000, 64), dtype=torch.float32, device="cpu"):
    """scatter(x, 1, index, src) for shape (M, N, K): x (M, N), index (M, K) of K distinct columns per
    row (with repeats torch leaves the result unspecified), src (M, K)."""
    m, n, k = _rank(shape, 3, "scatter")
    if k > n:
        raise ValueError(f"scatter needs K <= N distinct columns per row, got N={n}, K={k}")
    gen = _gen(seed)
    index = torch.argsort(torch.rand((m, n), generator=gen), dim=1)[:, :k].contiguous()
    return _randn(gen, (m, n), dtype, device), index.to(device), _randn(gen, (m, k), dtype, device)


def make_index_add(seed, shape=(512, 768, 300), dtype=torch.float32, device="cpu"):
    """index_add(x, 0, index, src) for shape (M, N, K): x (M, N), K row indices in [0, M) with repeats,
    src (K, N) (a gradient scattered back to embedding rows)."""
    m, n, k = _rank(shape, 3, "index_add")
    if m < 1 and k > 0:
        raise ValueError(f"index_add draws indices in [0, M), M={m}")
    gen = _gen(seed)
    index = torch.randint(0, max(m, 1), (k,), generator=gen)
    return _randn(gen, (m, n), dtype, device), index.to(device), _randn(gen, (k, n), dtype, device)


# ------------------------------------------------------------------------------------------------
# References: the torch op with the constants the kernel wrappers use.


def sum_ref(x):
    return torch.sum(x)


def sum_dim_ref(x):
    return torch.sum(x, dim=[-1])


def mean_dim_ref(x):
    return torch.mean(x, dim=[-1])


def var_mean_ref(x):
    return torch.var_mean(x, dim=[-1], correction=1)


def softmax_ref(x):
    return torch.softmax(x, dim=-1)


def log_softmax_ref(x):
    return torch.log_softmax(x, dim=-1)


def layer_norm_ref(x, weight, bias):
    return F.layer_norm(x, (x.shape[-1],), weight, bias, EPS_NORM)


def rms_norm_ref(x, weight):
    return F.rms_norm(x, (x.shape[-1],), weight, EPS_NORM)


def cumsum_ref(x):
    return torch.cumsum(x, dim=-1)


def argmax_ref(x):
    return torch.argmax(x, dim=-1)


def max_dim_ref(x):
    values, indices = torch.max(x, dim=-1)
    return values, indices


def min_dim_ref(x):
    values, indices = torch.min(x, dim=-1)
    return values, indices


def amax_ref(x):
    return torch.amax(x, dim=[-1])


def exp_ref(x):
    return torch.exp(x)


def log_ref(x):
    return torch.log(x)


def rsqrt_ref(x):
    return torch.rsqrt(x)


def sigmoid_ref(x):
    return torch.sigmoid(x)


def silu_ref(x):
    return F.silu(x)


def gelu_ref(x):
    return F.gelu(x)


def gelu_tanh_ref(x):
    return F.gelu(x, approximate="tanh")


def pow_ref(base, exponent):
    return torch.pow(base, exponent)


def div_ref(a, b):
    return torch.div(a, b)


def maximum_ref(a, b):
    return torch.maximum(a, b)


def where_ref(cond, a, b):
    return torch.where(cond, a, b)


def clamp_ref(x):
    return torch.clamp(x, CLAMP_MIN, CLAMP_MAX)


def isnan_ref(x):
    return torch.isnan(x)


def isinf_ref(x):
    return torch.isinf(x)


def nan_to_num_ref(x):
    return torch.nan_to_num(x, **NAN_TO_NUM)


def mm_ref(a, b):
    return torch.mm(a, b)


def addmm_ref(bias, a, b):
    return torch.addmm(bias, a, b, beta=ADDMM_BETA, alpha=ADDMM_ALPHA)


def bmm_ref(a, b):
    return torch.bmm(a, b)


def embedding_ref(indices, weight):
    return F.embedding(indices, weight)


def index_select_ref(x, index):
    return torch.index_select(x, 0, index)


def gather_ref(x, index):
    return torch.gather(x, 1, index)


def scatter_ref(x, index, src):
    return torch.scatter(x, 1, index, src)


def index_add_ref(x, index, src):
    return torch.index_add(x, 0, index, src, alpha=INDEX_ADD_ALPHA)
